/**
 * A knowledge document as plain text, and its chunks (docs/agents.md, "Knowledge").
 *
 * HTML and Markdown are reduced to their text before they are indexed, so that markup neither matches a
 * question nor fills the model's prompt. Both reducers are small and linear in the input (each `<` or line is
 * looked at a bounded number of times; a tag, comment or script left open drops the rest instead of being
 * searched for again), since documents come from members and reach a few hundred KiB.
 */

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

/** The named character references seen in ordinary prose; numeric ones are decoded in full. */
const ENTITIES = pairs(
  'amp:& lt:< gt:> quot:" apos:\' nbsp:\u00a0 ndash:– mdash:— hellip:… lsquo:‘ rsquo:’ ldquo:“ rdquo:” laquo:« raquo:»',
  'copy:© reg:® trade:™ euro:€ pound:£ middot:· bull:• eacute:é egrave:è agrave:à uuml:ü ouml:ö auml:ä szlig:ß ccedil:ç',
);

export function decodeEntities(text: string): string {
  return text.replace(/&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]{2,8});/g, (whole, name: string) => {
    if (name.startsWith('#')) {
      const code = name[1] === 'x' || name[1] === 'X' ? Number.parseInt(name.slice(2), 16) : Number.parseInt(name.slice(1), 10);
      // NUL, surrogates and values past Unicode are not characters (HTML maps them to U+FFFD); drop them.
      if (code === 0 || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return '';
      return String.fromCodePoint(code);
    }
    return ENTITIES.get(name) ?? whole;
  });
}

/** HTML to text: tags removed (block elements become line breaks), scripts and styles dropped, entities decoded. */
export function htmlToText(html: string): string {
  const lower = html.toLowerCase();
  let out = '';
  let i = 0;
  while (i < html.length) {
    const open = html.indexOf('<', i);
    if (open === -1) {
      out += html.slice(i);
      break;
    }
    out += html.slice(i, open);
    const next = html[open + 1] ?? '';
    if (html.startsWith('<!--', open)) {
      const end = html.indexOf('-->', open + 4);
      if (end === -1) break;
      i = end + 3;
      continue;
    }
    // `<` not followed by a name, `/`, `!` or `?` is text (`a < b`).
    if (!/[A-Za-z/!?]/.test(next)) {
      out += '<';
      i = open + 1;
      continue;
    }
    const close = tagEnd(html, open + 1);
    if (close === -1) break;
    const name = /^\/?([A-Za-z][A-Za-z0-9-]*)/.exec(html.slice(open + 1, Math.min(close, open + 40)))?.[1]?.toLowerCase() ?? '';
    i = close + 1;
    if (next !== '/' && RAW_TEXT.has(name)) {
      const end = lower.indexOf(`</${name}`, i);
      if (end === -1) break;
      const after = tagEnd(html, end + 2);
      if (after === -1) break;
      i = after + 1;
      continue;
    }
    if (BLOCK.has(name)) out += '\n';
  }
  return tidy(decodeEntities(out));
}

/** The `>` ending a tag that starts at `from`, quotes in attribute values respected; -1 when none. */
function tagEnd(html: string, from: number): number {
  let quote = '';
  for (let j = from; j < html.length; j++) {
    const c = html[j];
    if (quote) {
      if (c === quote) quote = '';
    } else if (c === '"' || c === "'") quote = c;
    else if (c === '>') return j;
  }
  return -1;
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
