/**
 * A knowledge document as plain text, and its chunks (docs/agents.md, "Knowledge").
 *
 * HTML and Markdown are reduced to their text before they are indexed, so that markup neither matches a
 * question nor fills the model's prompt. htmlparser2's tokenizer reads the HTML (and decodes its entities); the
 * Markdown reducer is small. Both are linear in the input (each tag or line is looked at a bounded number of
 * times; a tag, comment or script left open drops the rest instead of being searched for again), since
 * documents come from members and reach a few hundred KiB.
 */
import { Tokenizer } from 'htmlparser2';

/** A table written as space-separated `key:value` pairs. */
const pairs = (...lines: string[]) => new Map(lines.flatMap((line) => line.split(' ').map((pair) => pair.split(':') as [string, string])));

/** Elements whose content is not text a reader sees. */
const RAW_TEXT = new Set(['script', 'style', 'noscript', 'template', 'svg', 'head', 'iframe', 'object']);
/** Elements that start a new line where they open or close. */
const BLOCK = new Set(
  [
    'address article aside blockquote br dd div dl dt figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr li main',
    'nav ol p pre section summary table td th tr ul',
  ].flatMap((names) => names.split(' ')),
);

/**
 * HTML to text: tags removed (block elements become line breaks), scripts and styles dropped, entities decoded.
 * htmlparser2's tokenizer alone, not its parser: the parser keeps a stack of open elements that deeply nested or
 * unmatched tags make quadratic; each tag here is looked at once.
 */
export function htmlToText(html: string): string {
  let out = '';
  let name = '';
  // The element whose content is being dropped, up to its closing tag (or the end, when it has none).
  let hidden = '';
  const tag = (tagName: string, closing: boolean) => {
    if (hidden) {
      if (closing && tagName === hidden) hidden = '';
    } else if (!closing && RAW_TEXT.has(tagName)) hidden = tagName;
    else if (BLOCK.has(tagName)) out += '\n';
  };
  const opened = () => tag(name, false);
  const ignore = () => {};
  const tokenizer = new Tokenizer(
    {},
    {
      ontext: (start, end) => {
        if (!hidden) out += html.slice(start, end);
      },
      ontextentity: (codePoint) => {
        // U+FFFD is what HTML makes of NUL, surrogates and values past Unicode: not characters; dropped.
        if (!hidden && codePoint !== 0xfffd) out += String.fromCodePoint(codePoint);
      },
      onopentagname: (start, end) => {
        name = html.slice(start, end).toLowerCase();
      },
      onopentagend: opened,
      onselfclosingtag: opened,
      onclosetag: (start, end) => tag(html.slice(start, end).toLowerCase(), true),
      onattribdata: ignore,
      onattribentity: ignore,
      onattribend: ignore,
      onattribname: ignore,
      oncdata: ignore,
      oncomment: ignore,
      ondeclaration: ignore,
      onprocessinginstruction: ignore,
      onend: ignore,
    },
  );
  tokenizer.write(html);
  tokenizer.end();
  return tidy(out);
}

/** Markdown to text: the markup of headings, quotes, lists, emphasis, code, links, images and tables removed. */
export function markdownToText(markdown: string): string {
  const lines: string[] = [];
  let fence = '';
  for (const raw of markdown.split(/\r?\n/)) {
    const fenceMark = /^\s{0,3}(`{3,}|~{3,})/.exec(raw)?.[1];
    if (fence) {
      if (fenceMark && fenceMark[0] === fence[0] && fenceMark.length >= fence.length) fence = '';
      else lines.push(raw);
      continue;
    }
    if (fenceMark) {
      fence = fenceMark;
      continue;
    }
    let line = raw;
    // Reference definitions (`[id]: https://…`) and rules (`---`) are no text; table separators neither.
    if (/^\s{0,3}\[[^\]]{1,200}\]:\s/.test(line) || /^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line) || /^\s*\|?\s*:?-{3,}/.test(line)) {
      lines.push('');
      continue;
    }
    line = line.replace(/^\s{0,3}(>\s?)+/, '');
    line = line.replace(/^\s{0,3}#{1,6}\s+/, '').replace(/\s+#+\s*$/, '');
    line = line.replace(/^\s*(?:[-*+]|\d{1,9}[.)])\s+(?:\[[ xX]\]\s+)?/, '');
    // Links and images only where a line has their middle (`](`, `][`): the patterns' bounded scans then run on
    // lines that may hold one, not on every `[` of a document.
    if (line.includes('](')) line = line.replace(/!?\[([^\]]{0,200})\]\([^)]{0,300}\)/g, '$1');
    if (line.includes('][')) line = line.replace(/\[([^\]]{0,200})\]\[[^\]]{0,100}\]/g, '$1');
    line = line.replace(/`+/g, '');
    line = line.replace(/(\*\*|__)(?=\S)([^*_]{1,500}?)(?<=\S)\1/g, '$2');
    line = line.replace(/(^|[^\w*])[*_](?=\S)([^*_]{1,500}?)(?<=\S)[*_](?![\w*])/g, '$1$2');
    line = line.replace(/~~(?=\S)([^~]{1,500}?)~~/g, '$1');
    if (line.includes('|'))
      line = line
        .replace(/^\s*\|/, '')
        .replace(/\|\s*$/, '')
        .replaceAll('|', ' ');
    lines.push(line);
  }
  // Inline HTML and entities are valid Markdown.
  return htmlToText(lines.join('\n'));
}

/** White space within lines collapsed, at most one blank line between paragraphs. */
function tidy(text: string): string {
  return text
    .split('\n')
    .map((line) => line.replace(/[ \t\f\v\u00a0]+/g, ' ').trim())
    .join('\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
}

export type KnowledgeContentType = 'text/plain' | 'text/markdown' | 'text/html';

export function documentText(content: string, contentType: KnowledgeContentType): string {
  if (contentType === 'text/html') return htmlToText(content);
  if (contentType === 'text/markdown') return markdownToText(content);
  return tidy(content.replace(/\r\n?/g, '\n'));
}

/** Words in one chunk, and words a chunk repeats from the one before it (a passage cut in two is found whole). */
export const CHUNK_WORDS = 200;
export const CHUNK_OVERLAP_WORDS = 40;

/**
 * Passages of about `CHUNK_WORDS` words, each starting `CHUNK_OVERLAP_WORDS` words before the previous one
 * ended. A chunk ends at the end of a sentence or paragraph when one lies in its last quarter, so passages read
 * as whole sentences. Paragraph breaks are kept inside a chunk.
 */
export function chunkText(text: string, size = CHUNK_WORDS, overlap = CHUNK_OVERLAP_WORDS): string[] {
  // Words with the white space that followed them, so that a chunk keeps its line breaks.
  const words = [...text.matchAll(/(\S+)(\s*)/g)].map((m) => ({
    word: m[1],
    gap: m[2].includes('\n\n') ? '\n\n' : m[2].includes('\n') ? '\n' : ' ',
  }));
  const chunks: string[] = [];
  let start = 0;
  while (start < words.length) {
    let end = Math.min(words.length, start + size);
    if (end < words.length) {
      for (let j = end - 1; j >= start + Math.floor((size * 3) / 4); j--) {
        if (/[.!?:;]["')\]]?$/.test(words[j].word) || words[j].gap !== ' ') {
          end = j + 1;
          break;
        }
      }
    }
    const piece = words
      .slice(start, end)
      .map((w, k, all) => w.word + (k < all.length - 1 ? w.gap : ''))
      .join('');
    chunks.push(piece);
    if (end >= words.length) break;
    start = Math.max(start + 1, end - overlap);
  }
  return chunks;
}

/**
 * PostgreSQL's text search configuration for a BCP 47 language tag (its stemmer and stop words); `simple`
 * (lower-cased words, no stemming) for languages PostgreSQL ships none for. Every configuration named here
 * exists in PostgreSQL 14 and later and in PGlite.
 */
const CONFIGS = pairs(
  'ar:arabic hy:armenian eu:basque ca:catalan da:danish nl:dutch en:english et:estonian fi:finnish fr:french de:german',
  'el:greek hi:hindi hu:hungarian id:indonesian ga:irish it:italian lt:lithuanian ne:nepali no:norwegian nb:norwegian',
  'nn:norwegian pt:portuguese ro:romanian ru:russian sr:serbian es:spanish sv:swedish ta:tamil tr:turkish yi:yiddish',
);

export function textSearchConfig(language: string | undefined): string {
  return CONFIGS.get((language ?? '').split('-')[0].toLowerCase()) ?? 'simple';
}
