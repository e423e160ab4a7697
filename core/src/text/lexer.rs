//! The lexer of the text format: turns TVMScript source into a flat vector of compact tokens
//! with Python-style `Newline` / `Indent` / `Dedent` tokens.
//!
//! ```text
//! def main(x: R.Tensor((2, 3), dtype="float32")):   # Ident Ident ( Ident : Ident . Ident ( ...
//!     return x                                      # Newline Indent Ident Ident Newline Dedent
//! ```
//!
//! Contract: tokens carry only their kind and byte range (`start..end`) in the source; values
//! (numbers, string contents) are decoded on demand by the parser, and line:col positions are
//! computed only when an error is reported. Inside brackets line breaks and indentation are
//! ignored (implicit line joining). Comments (`# ...`) and blank lines produce no tokens. Errors
//! are `(byte offset, message)`; the lexer never panics and runs in linear time.

/// The kind of a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tk {
    /// An identifier (keywords included).
    Ident,
    /// An integer literal (digits only).
    Int,
    /// A float literal (`1.5`, `1e-05`).
    Float,
    /// A string literal, quotes included.
    Str,
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Eq,
    Dot,
    Arrow,
    Plus,
    Minus,
    Star,
    SlashSlash,
    Percent,
    At,
    /// The end of a logical line.
    Newline,
    /// The start of a more indented block.
    Indent,
    /// The end of an indented block.
    Dedent,
    /// The end of the input.
    Eof,
}

/// A token: its kind and byte range in the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub kind: Tk,
    pub start: u32,
    pub end: u32,
}

/// A lexer error: byte offset and message.
pub(crate) type LexError = (usize, String);

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Lexes `src[start..end]`. With `joined` set the whole range is treated as if inside brackets
/// (no line structure): used for dimension strings such as `"h - kh + 1"`.
pub(crate) fn lex(
    src: &str,
    start: usize,
    end: usize,
    joined: bool,
) -> Result<Vec<Token>, LexError> {
    if src.len() > u32::MAX as usize - 1 {
        return Err((0, "input is too large (more than 4 GiB)".to_string()));
    }
    let b = src.as_bytes();
    let end = end.min(b.len());
    let mut toks: Vec<Token> = Vec::with_capacity((end.saturating_sub(start)) / 2 + 8);
    let mut indents: Vec<usize> = vec![0];
    let mut depth: usize = usize::from(joined);
    let mut i = start;
    let mut at_line_start = !joined;
    let push = |toks: &mut Vec<Token>, kind: Tk, s: usize, e: usize| {
        toks.push(Token {
            kind,
            start: s as u32,
            end: e as u32,
        });
    };
    while i < end {
        if at_line_start && depth == 0 {
            let mut width = 0usize;
            while i < end && matches!(b.get(i), Some(b' ' | b'\t' | b'\r' | b'\x0c')) {
                if b.get(i) != Some(&b'\r') {
                    width += 1;
                }
                i += 1;
            }
            if i >= end {
                break;
            }
            match b.get(i) {
                Some(b'\n') => {
                    i += 1;
                    continue;
                }
                Some(b'#') => {
                    while i < end && b.get(i) != Some(&b'\n') {
                        i += 1;
                    }
                    continue;
                }
                _ => {}
            }
            let top = indents.last().copied().unwrap_or(0);
            if width > top {
                indents.push(width);
                push(&mut toks, Tk::Indent, i, i);
            } else if width < top {
                while indents.last().is_some_and(|&t| t > width) {
                    indents.pop();
                    push(&mut toks, Tk::Dedent, i, i);
                }
                if indents.last().copied().unwrap_or(0) != width {
                    return Err((
                        i,
                        "inconsistent indentation: this line matches no enclosing block"
                            .to_string(),
                    ));
                }
            }
            at_line_start = false;
        }
        let Some(&c) = b.get(i) else { break };
        let s = i;
        match c {
            b' ' | b'\t' | b'\r' | b'\x0c' => i += 1,
            b'\n' => {
                if depth == 0 {
                    push(&mut toks, Tk::Newline, s, s);
                    at_line_start = true;
                }
                i += 1;
            }
            b'#' => {
                while i < end && b.get(i) != Some(&b'\n') {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                let kind = match c {
                    b'(' => Tk::LParen,
                    b'[' => Tk::LBracket,
                    _ => Tk::LBrace,
                };
                i += 1;
                push(&mut toks, kind, s, i);
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1).max(usize::from(joined));
                let kind = match c {
                    b')' => Tk::RParen,
                    b']' => Tk::RBracket,
                    _ => Tk::RBrace,
                };
                i += 1;
                push(&mut toks, kind, s, i);
            }
            b',' | b':' | b'=' | b'.' | b'+' | b'*' | b'%' | b'@' => {
                let kind = match c {
                    b',' => Tk::Comma,
                    b':' => Tk::Colon,
                    b'=' => Tk::Eq,
                    b'.' => Tk::Dot,
                    b'+' => Tk::Plus,
                    b'*' => Tk::Star,
                    b'%' => Tk::Percent,
                    _ => Tk::At,
                };
                i += 1;
                push(&mut toks, kind, s, i);
            }
            b'-' => {
                if b.get(i + 1) == Some(&b'>') {
                    i += 2;
                    push(&mut toks, Tk::Arrow, s, i);
                } else {
                    i += 1;
                    push(&mut toks, Tk::Minus, s, i);
                }
            }
            b'/' => {
                if b.get(i + 1) == Some(&b'/') {
                    i += 2;
                    push(&mut toks, Tk::SlashSlash, s, i);
                } else {
                    return Err((
                        s,
                        "unexpected character `/` (only `//` is supported)".into(),
                    ));
                }
            }
            b'"' | b'\'' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None | Some(b'\n') => {
                            return Err((s, "unterminated string literal".to_string()));
                        }
                        Some(&q) if q == c => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => i += 2,
                        Some(_) => i += 1,
                    }
                    if i >= end {
                        return Err((s, "unterminated string literal".to_string()));
                    }
                }
                push(&mut toks, Tk::Str, s, i);
            }
            b'0'..=b'9' => {
                let mut kind = Tk::Int;
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
                if b.get(i) == Some(&b'.') {
                    kind = Tk::Float;
                    i += 1;
                    while matches!(b.get(i), Some(b'0'..=b'9')) {
                        i += 1;
                    }
                }
                if matches!(b.get(i), Some(b'e' | b'E')) {
                    let mut j = i + 1;
                    if matches!(b.get(j), Some(b'+' | b'-')) {
                        j += 1;
                    }
                    if matches!(b.get(j), Some(b'0'..=b'9')) {
                        kind = Tk::Float;
                        i = j;
                        while matches!(b.get(i), Some(b'0'..=b'9')) {
                            i += 1;
                        }
                    }
                }
                push(&mut toks, kind, s, i.min(end));
                i = i.min(end);
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                i += 1;
                while let Some(&c) = b.get(i) {
                    if i >= end {
                        break;
                    }
                    if c.is_ascii_alphanumeric() || c == b'_' {
                        i += 1;
                    } else if c >= 0x80 {
                        // A non-ASCII identifier character: continue on the slow path.
                        match src.get(i..end).and_then(|r| r.chars().next()) {
                            Some(ch) if is_ident_continue(ch) => i += ch.len_utf8(),
                            _ => break,
                        }
                    } else {
                        break;
                    }
                }
                push(&mut toks, Tk::Ident, s, i);
            }
            _ => {
                let ch = src
                    .get(i..)
                    .and_then(|r| r.chars().next())
                    .unwrap_or('\u{fffd}');
                if is_ident_start(ch) {
                    i += ch.len_utf8();
                    while let Some(ch) = src.get(i..end).and_then(|r| r.chars().next()) {
                        if !is_ident_continue(ch) {
                            break;
                        }
                        i += ch.len_utf8();
                    }
                    push(&mut toks, Tk::Ident, s, i);
                } else {
                    let shown = if ch.is_control() {
                        format!("{ch:?}")
                    } else {
                        format!("`{ch}`")
                    };
                    return Err((s, format!("unexpected character {shown}")));
                }
            }
        }
    }
    let end32 = end;
    if !joined {
        if toks.last().is_some_and(|t| !matches!(t.kind, Tk::Newline)) {
            push(&mut toks, Tk::Newline, end32, end32);
        }
        while indents.len() > 1 {
            indents.pop();
            push(&mut toks, Tk::Dedent, end32, end32);
        }
    }
    push(&mut toks, Tk::Eof, end32, end32);
    Ok(toks)
}

/// Decodes the contents of a string token's text (quotes included). Errors give the byte offset
/// of the bad escape relative to the start of `raw`.
pub(crate) fn unescape(raw: &str) -> Result<String, (usize, String)> {
    let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
    if !inner.contains('\\') {
        return Ok(inner.to_string());
    }
    let mut out = String::with_capacity(inner.len());
    let mut it = inner.char_indices().peekable();
    while let Some((k, c)) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some((_, e)) = it.next() else {
            return Err((k + 1, "unterminated escape sequence".into()));
        };
        match e {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            '\\' => out.push('\\'),
            '\'' => out.push('\''),
            '"' => out.push('"'),
            'x' | 'u' | 'U' => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let mut v: u32 = 0;
                for _ in 0..n {
                    let d = it.next().and_then(|(_, h)| h.to_digit(16));
                    let Some(d) = d else {
                        return Err((k + 1, format!("invalid `\\{e}` escape")));
                    };
                    v = v * 16 + d;
                }
                match char::from_u32(v) {
                    Some(ch) => out.push(ch),
                    None => return Err((k + 1, format!("invalid character code {v:#x}"))),
                }
            }
            other => return Err((k + 1, format!("unknown escape sequence `\\{other}`"))),
        }
    }
    Ok(out)
}

/// Quotes a string the way the printer writes string literals (double quotes, escapes).
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<Tk> {
        lex(s, 0, s.len(), false)
            .map(|t| t.iter().map(|t| t.kind).collect())
            .unwrap_or_default()
    }

    #[test]
    fn line_structure() {
        use Tk::*;
        let k = kinds("a:\n    b # c\n\n  # x\n    (c,\n d)\ne\n");
        assert_eq!(
            k,
            vec![
                Ident, Colon, Newline, Indent, Ident, Newline, LParen, Ident, Comma, Ident, RParen,
                Newline, Dedent, Ident, Newline, Eof
            ]
        );
    }

    #[test]
    fn numbers_and_strings() {
        use Tk::*;
        assert_eq!(
            kinds("1 1.5 1e-05 \"a\\\"b\" x->y //"),
            vec![
                Int, Float, Float, Str, Ident, Arrow, Ident, SlashSlash, Newline, Eof
            ]
        );
        assert_eq!(unescape("\"a\\\"b\\n\"").ok().as_deref(), Some("a\"b\n"));
        assert_eq!(quote("a\"b\n"), "\"a\\\"b\\n\"");
    }

    #[test]
    fn errors() {
        assert!(lex("\"abc", 0, 4, false).is_err());
        assert!(lex("a\n  b\n c\n", 0, 9, false).is_err());
        assert!(lex("a ` b", 0, 5, false).is_err());
    }
}
