/**
 * The demo agent's knowledge document: a short FAQ about Parley itself, so that a new installation shows
 * `search_knowledge` at work (docs/agents.md, "Knowledge"). Markdown, as members would upload it.
 */
export const DEMO_FAQ_TITLE = 'Parley FAQ';

export const DEMO_FAQ = `# Parley FAQ

## What is Parley?
Parley is a platform where AI agents and human operators answer customers together, on chat and on the phone.
Every conversation, call and transcript is available through one JSON:API.

## How do I talk to a human?
Ask for a person at any time. The agent hands the conversation to an operator who is available; operators see
it in the console at /console and answer from there.

## How do I embed the chat widget on my website?
Add one script tag with your publishable key and the agent's id:
\`<script src="https://your-parley/widget.js" data-key="PUBLISHABLE_KEY" data-agent="AGENT_ID" async></script>\`.
The site's origin must be listed in CORS_ALLOWED_ORIGINS.

## Can the agent answer phone calls?
Yes. Give the agent a phone number (POST /api/phone_numbers with its ai_agent_id). The voice runtime answers
the call, transcribes the caller and speaks the agent's replies.

## Which AI models does Parley support?
Any OpenAI-compatible chat completions endpoint: set LLM_BASE_URL, LLM_API_KEY and LLM_MODEL. Without a model,
agents follow their scripted workflow and hand conversations to operators.

## How do agents know about my products?
Upload knowledge documents (text, Markdown or HTML) with POST /api/knowledge_documents. Agents search them and
cite the passages they used in the reply's metadata.sources.

## What happens when a conversation ends?
When a conversation closes or its call ends, the model writes an analysis: a summary, whether it succeeded and
the data the agent's analysis schema asks for. It appears in the console and as a Conversation.analysed event.

## Where is my data stored?
In your own PostgreSQL database, or in the embedded database in DATA_DIR when you try Parley out. Nothing is
sent anywhere except to the model and speech endpoints you configure.
`;
