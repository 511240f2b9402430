// A writer process of bench/streams.ts: creates conversation items at a given rate (autocannon), round robin
// over the conversations it is given, and reports how many it wrote. A process of its own, so that the rate it
// offers does not wait for the event loop that reads the benchmark's thousands of streams (in that process the
// writer reached 50-67 of the 200 writes/s asked on a loaded machine, docs/benchmarks.md).
// Started by bench/streams.ts with fork(); receives { url, token, conversations, rate, seconds, connections }.
import autocannon from 'autocannon';

process.once('message', async ({ url, token, conversations, rate, seconds, connections }) => {
  let n = 0;
  const result = await autocannon({
    url,
    connections,
    overallRate: rate,
    duration: seconds,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/vnd.api+json' },
    requests: [
      {
        setupRequest: (request) => {
          const conversation_id = conversations[n++ % conversations.length];
          const body = JSON.stringify({
            data: { type: 'ConversationItem', attributes: { conversation_id, role: 'user', content: 'Benchmark message' } },
          });
          return { ...request, method: 'POST', path: '/api/conversation_items', body };
        },
      },
    ],
  });
  process.send(
    { written: result.requests.total - result.non2xx, errors: result.errors + result.timeouts + result.non2xx, p99: result.latency.p99 },
    () => process.exit(0),
  );
});
