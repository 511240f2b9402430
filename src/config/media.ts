/**
 * Settings of the media plane: rtpengine, which `parley sip serve` runs beside Kamailio and which anchors every
 * call's RTP (docs/sip.md, "Media plane").
 */
import net from 'node:net';

function int(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new Error(`${name} must be an integer from ${min} to ${max}, got "${raw}"`);
  return value;
}

function address(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const raw = env[name]?.trim();
  if (!raw) return undefined;
  const bare = raw.replace(/^\[|\]$/g, '');
  if (!net.isIP(bare)) throw new Error(`${name} must be an IP address (IPv4 or IPv6), got "${raw}"`);
  if (bare === '0.0.0.0' || bare === '::') throw new Error(`${name} must be a concrete address, not the wildcard ${bare}`);
  return bare;
}

export function loadMediaSettings(env: NodeJS.ProcessEnv = process.env) {
  // 20000-29999 by default: apart from the voice runtime's own RTP ports (VOICE_RTP_PORT_MIN, 40000) and from
  // Debian's rtpengine-daemon defaults (30000-40000, should its system service run too); 10000 ports are 2500
  // calls (each call takes an RTP and an RTCP port per side).
  const rtpPortMin = int(env, 'RTP_PORT_MIN', 20000, 1024, 65534);
  const rtpPortMax = int(env, 'RTP_PORT_MAX', 29999, 1025, 65535);
  // Two calls' worth at least: a call takes four ports (RTP and RTCP, RFC 3550 section 11, on each side).
  if (rtpPortMax - rtpPortMin + 1 < 8)
    throw new Error(`RTP_PORT_MIN..RTP_PORT_MAX must span at least 8 ports (two calls), got ${rtpPortMin}..${rtpPortMax}`);
  return {
    /** The lowest and highest UDP port rtpengine takes for RTP and RTCP (RTP_PORT_MIN, RTP_PORT_MAX). */
    rtpPortMin,
    rtpPortMax,
    /**
     * The address written into the SDP rtpengine hands each party (MEDIA_ADVERTISED_ADDRESS): the host's public
     * address when rtpengine listens on a private one (a host behind 1:1 NAT, a container). Unset: the listen address.
     */
    advertisedAddress: address(env, 'MEDIA_ADVERTISED_ADDRESS'),
    /**
     * The local address rtpengine binds RTP on (MEDIA_LISTEN_ADDRESS). Unset: the first SIP_LISTEN address when it
     * is a concrete one, else the address of the host's first non-internal interface (see resolveMediaListen).
     */
    listenAddress: address(env, 'MEDIA_LISTEN_ADDRESS'),
    /** Seconds without RTP after which rtpengine ends a session whose BYE never came (RTP_TIMEOUT_SECONDS). */
    timeoutSeconds: int(env, 'RTP_TIMEOUT_SECONDS', 60, 5, 86_400),
    rtpengineBinary: env.RTPENGINE_BIN || 'rtpengine',
    /** rtpengine's log level (syslog levels, 0-7); 5 (notices) by default. */
    logLevel: int(env, 'RTPENGINE_LOG_LEVEL', 5, 0, 7),
  };
}
