// Hearth web chat: a small Markdown renderer for model answers that builds DOM nodes directly
// (createElement + textContent), so model text never passes through innerHTML. Not CommonMark:
// paragraphs, headings, emphasis, strikethrough, inline code, fenced code, lists, quotes, rules, links.
'use strict';

const HearthMarkdown = (() => {
  const kMaxDepth = 6;          // nesting of quotes / lists rendered as structure; deeper is text
  const kMaxInlineChars = 20000; // a longer paragraph is shown as plain text (keeps rendering linear)

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*#*[ \t]*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/;

  // Links become anchors only for these schemes; anything else (javascript:, data:, ...) is text.
  function safeHref(url) {
    return /^(https?:\/\/|mailto:)/i.test(url) ? url : null;
  }

  function el(tag, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    return e;
  }

  function anchor(href, text) {
    const a = el('a');
    a.setAttribute('href', href);
    a.setAttribute('rel', 'noopener noreferrer');
    a.setAttribute('target', '_blank');
    a.textContent = text;
    return a;
  }

  // Inline spans, earliest match first: code, link, bold, italic, strikethrough, bare URL.
  const INLINE = new RegExp([
    '(?<tick>`+)(?<code>[^`]|[^`][\\s\\S]*?[^`])\\k<tick>(?!`)',
    // link text bounded: unbounded, every "[" scanned to the line's end (quadratic on "[[[[...")
    '\\[(?<ltext>[^\\]\\n]{1,500})\\]\\(\\s*<?(?<lurl>[^\\s()<>]{1,2000})>?\\s*\\)',
    '\\*\\*(?=\\S)(?<b1>[^\\n]*?\\S)\\*\\*',
    '(?<![\\w])__(?=\\S)(?<b2>[^\\n]*?\\S)__(?![\\w])',
    '\\*(?=[^\\s*])(?<e1>[^*\\n]*?[^\\s*])\\*',
    '(?<![\\w])_(?=[^\\s_])(?<e2>[^_\\n]*?[^\\s_])_(?![\\w])',
    '~~(?=\\S)(?<del>[^\\n]*?\\S)~~',
    '(?<url>https?:\\/\\/[^\\s<>"\'`]*[^\\s<>"\'`.,:;!?)\\]])',
  ].join('|'), 'g');

  // Appends text with "\n" turned into <br>.
  function appendText(parent, text) {
    const parts = text.split('\n');
    parts.forEach((p, i) => {
      if (i) parent.append(el('br'));
      if (p) parent.append(document.createTextNode(p));
    });
  }

  function inline(parent, text, depth) {
    if (depth > kMaxDepth || text.length > kMaxInlineChars) { appendText(parent, text); return; }
    const re = new RegExp(INLINE.source, 'g');
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      const g = m.groups;
      if (m.index > last) appendText(parent, text.slice(last, m.index));
      last = re.lastIndex;
      if (g.code !== undefined) {
        const c = el('code');
        // CommonMark: one leading and trailing space is stripped when both are there.
        c.textContent = /^ [\s\S]* $/.test(g.code) && g.code.trim() ? g.code.slice(1, -1) : g.code;
        parent.append(c);
      } else if (g.ltext !== undefined) {
        const href = safeHref(g.lurl);
        if (href) parent.append(anchor(href, g.ltext));
        else appendText(parent, m[0]);
      } else if (g.url !== undefined) {
        parent.append(anchor(g.url, g.url));
      } else {
        const tag = g.b1 !== undefined || g.b2 !== undefined ? 'strong' : g.del !== undefined ? 'del' : 'em';
        const span = el(tag);
        inline(span, g.b1 ?? g.b2 ?? g.e1 ?? g.e2 ?? g.del, depth + 1);
        parent.append(span);
      }
    }
    if (last < text.length) appendText(parent, text.slice(last));
  }

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  const indentOf = (line) => line.length - line.trimStart().length;

  // Renders lines[] as blocks into parent.
  function blocks(parent, lines, depth) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) { i++; continue; }
      let m;
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        i++;
        while (i < lines.length && !new RegExp('^ {0,3}' + fence[0] + '{' + fence.length + ',}\\s*$').test(lines[i])) body.push(lines[i++]);
        i++;  // the closing fence (absent while a reply is still streaming)
        const pre = el('pre');
        const code = el('code');
        if (m[2] && /^[\w+#.-]{1,32}$/.test(m[2])) {
          code.className = 'language-' + m[2];
          pre.dataset.lang = m[2];
        }
        code.textContent = body.join('\n');
        pre.append(code);
        parent.append(pre);
      } else if ((m = HEADING.exec(line)) && depth <= kMaxDepth) {
        const h = el('h' + m[1].length);
        inline(h, m[2] || '', depth);
        parent.append(h);
        i++;
      } else if (RULE.test(line)) {
        parent.append(el('hr'));
        i++;
      } else if (QUOTE.test(line) && depth < kMaxDepth) {
        const inner = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) { inner.push(m[1]); i++; }
        const q = el('blockquote');
        blocks(q, inner, depth + 1);
        parent.append(q);
      } else if ((m = ITEM.exec(line)) && depth < kMaxDepth) {
        i = list(parent, lines, i, depth);
      } else {
        const para = [line.trim()];
        i++;
        while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) para.push(lines[i++].trim());
        const p = el('p');
        inline(p, para.join('\n'), depth);
        parent.append(p);
      }
    }
  }

  // A list starting at lines[start]; returns the index after it. Items of the same kind (ordered or
  // not) indented less than the item above's content (CommonMark: " 2." after "1. a" is a sibling);
  // lines indented as far as the content belong to the item above (nested blocks).
  function list(parent, lines, start, depth) {
    const first = ITEM.exec(lines[start]);
    const baseIndent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const listEl = el(ordered ? 'ol' : 'ul');
    if (ordered) {
      const n = parseInt(first[2], 10);
      if (n !== 1) listEl.start = n;
    }
    let i = start;
    let limit = baseIndent + first[2].length + 1; // a sibling's marker is indented less than this
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length >= limit || /\d/.test(m[2]) !== ordered) break;
      const contentIndent = m[1].length + m[2].length + 1;
      limit = contentIndent;
      const body = [m[3] || ''];
      i++;
      while (i < lines.length) {
        const l = lines[i];
        if (!l.trim()) {
          // A blank line continues the item only when an indented line follows.
          let j = i;
          while (j < lines.length && !lines[j].trim()) j++;
          if (j < lines.length && indentOf(lines[j]) > baseIndent) { while (i < j) body.push(lines[i++].trim()); continue; }
          break;
        }
        const im = ITEM.exec(l);
        if (im && im[1].length < contentIndent) break;
        if (!im && indentOf(l) <= baseIndent && startsBlock(l)) break;
        body.push(l.slice(Math.min(indentOf(l), contentIndent)));
        i++;
      }
      const li = el('li');
      blocks(li, body, depth + 1);
      // A tight item (a paragraph, maybe followed by a nested list) shows its text without the
      // paragraph's margins.
      const kids = [...li.childNodes];
      if (kids.length && kids[0].nodeName === 'P' && kids.slice(1).every((k) => k.nodeName === 'UL' || k.nodeName === 'OL'))
        kids[0].replaceWith(...kids[0].childNodes);
      listEl.append(li);
      // Blank lines between items of one list.
      let j = i;
      while (j < lines.length && !lines[j].trim()) j++;
      const next = j < lines.length ? ITEM.exec(lines[j]) : null;
      if (next && next[1].length < limit && /\d/.test(next[2]) === ordered) i = j;
    }
    parent.append(listEl);
    return i;
  }

  /// Markdown text → a DocumentFragment of safe elements (p, h1-h6, strong, em, del, code, pre,
  /// ul, ol, li, blockquote, hr, br, a[href=http(s)/mailto, rel=noopener noreferrer]).
  function render(text) {
    const frag = document.createDocumentFragment();
    blocks(frag, String(text).replace(/\r\n?/g, '\n').split('\n'), 0);
    return frag;
  }

  return { render };
})();
