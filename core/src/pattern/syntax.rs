//! The text syntax of patterns (for TOML configs and the CLI), parsed into the same AST as the
//! builders; `Pattern`'s `Display` prints it back (print → parse is the identity).
//!
//! ```text
//! _                                         wildcard
//! const                                     a constant
//! var | var("x")                            an unbound var (a parameter), optionally by name
//! relax.nn.relu(p)                          a call (the `relax.` prefix may be omitted)
//! relax.concat(p, ...)                      at least these arguments
//! relax.nn.conv2d{groups=1}(_, _)           attribute constraints
//! p | q      p & q      !p                  alternatives, both, negation
//! p[0]  p[?]                                tuple-get-item (fixed or any index)
//! (p, q)                                    a tuple
//! p : float16     p : [?, 64]               dtype and shape constraints
//! name @ p                                  a named capture
//! ... where a ^ b, c >> d                   graph constraints between captures
//! ```
//!
//! Precedence, loosest first: `|`, `&`, `@`, `:`, `!`, postfix `[i]`.

use super::ast::{EdgeKind, GraphConstraint, PatId, PatNode, Pattern, PatternBuilder, ShapeDim};
use crate::error::{Error, Pos, Result};
use crate::ir::{DType, Dim};
use crate::op::{AttrLit, Op};

/// Parses a pattern; errors carry the position in `src` (file `<pattern>`).
pub fn parse_pattern(src: &str) -> Result<Pattern> {
    parse_pattern_in(src, "<pattern>")
}

/// Parses a pattern; errors name `file`.
pub fn parse_pattern_in(src: &str, file: &str) -> Result<Pattern> {
    let mut p = Parser {
        src,
        file,
        chars: src.char_indices().collect(),
        i: 0,
        b: PatternBuilder::new(),
        depth: 0,
    };
    let root = p.alt()?;
    let mut constraints = Vec::new();
    p.ws();
    if p.keyword("where") {
        loop {
            p.ws();
            let from = p
                .ident()
                .ok_or_else(|| p.err("expected a capture name after `where`"))?;
            p.ws();
            let kind = if p.eat(">>") {
                EdgeKind::OnlyUsedBy
            } else if p.eat("^") {
                EdgeKind::UsedBy
            } else {
                return Err(p.err("expected `^` (used by) or `>>` (only used by)"));
            };
            p.ws();
            let to = p.ident().ok_or_else(|| p.err("expected a capture name"))?;
            constraints.push(GraphConstraint { from, to, kind });
            p.ws();
            if !p.eat(",") {
                break;
            }
        }
    }
    p.ws();
    if p.i < p.chars.len() {
        return Err(p.err("expected the end of the pattern, `|`, `&` or `where`"));
    }
    let mut pat = p.b.finish(root);
    for c in &constraints {
        for name in [&c.from, &c.to] {
            if !pat
                .nodes
                .iter()
                .any(|(_, n)| matches!(n, PatNode::Capture(x, _) if x == name))
            {
                return Err(Error::source(
                    file,
                    src,
                    Pos { line: 1, col: 1 },
                    format!("the constraint names `{name}`, which is not a capture in the pattern"),
                ));
            }
        }
    }
    pat.constraints = constraints;
    Ok(pat)
}

struct Parser<'s> {
    src: &'s str,
    file: &'s str,
    chars: Vec<(usize, char)>,
    i: usize,
    b: PatternBuilder,
    depth: usize,
}

impl Parser<'_> {
    fn pos(&self) -> Pos {
        // Line and column of the current char.
        let offset = self.chars.get(self.i).map_or(self.src.len(), |c| c.0);
        let before = &self.src[..offset];
        let line = before.matches('\n').count() as u32 + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
        Pos { line, col }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the pattern".into(),
            Some(c) => format!("`{c}`"),
        }
    }

    fn err(&self, expected: &str) -> Error {
        Error::source(
            self.file,
            self.src,
            self.pos(),
            format!("{expected}, found {}", self.found()),
        )
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.i).map(|c| c.1)
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        let ok = self
            .chars
            .get(self.i..self.i + n)
            .is_some_and(|w| w.iter().map(|c| c.1).eq(s.chars()));
        if ok {
            self.i += n;
        }
        ok
    }

    fn keyword(&mut self, kw: &str) -> bool {
        let save = self.i;
        if self.eat(kw) && !self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return true;
        }
        self.i = save;
        false
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        if !self.peek().is_some_and(|c| c.is_alphabetic() || c == '_') {
            return None;
        }
        while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            self.i += 1;
        }
        Some(self.chars[start..self.i].iter().map(|c| c.1).collect())
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > 200 {
            return Err(self.err("the pattern nests too deeply (over 200 levels)"));
        }
        Ok(())
    }

    fn alt(&mut self) -> Result<PatId> {
        self.enter()?;
        let mut left = self.and()?;
        loop {
            self.ws();
            if self.peek() == Some('|') {
                self.i += 1;
                let right = self.and()?;
                left = self.b.or(left, right);
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<PatId> {
        let mut left = self.capture()?;
        loop {
            self.ws();
            if self.peek() == Some('&') {
                self.i += 1;
                let right = self.capture()?;
                left = self.b.and(left, right);
            } else {
                break;
            }
        }
        Ok(left)
    }

    fn capture(&mut self) -> Result<PatId> {
        self.ws();
        let save = self.i;
        if let Some(name) = self.ident() {
            self.ws();
            if self.peek() == Some('@') {
                self.i += 1;
                self.enter()?;
                let inner = self.capture()?;
                self.depth -= 1;
                return Ok(self.b.capture(&name, inner));
            }
        }
        self.i = save;
        self.typed()
    }

    fn typed(&mut self) -> Result<PatId> {
        let mut p = self.unary()?;
        loop {
            self.ws();
            if self.peek() != Some(':') {
                return Ok(p);
            }
            self.i += 1;
            self.ws();
            if self.peek() == Some('[') {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    self.ws();
                    if self.eat("]") {
                        break;
                    }
                    if !dims.is_empty() {
                        if !self.eat(",") {
                            return Err(self.err("expected `,` or `]` in a shape"));
                        }
                        self.ws();
                    }
                    if self.eat("?") {
                        dims.push(ShapeDim::Any);
                    } else if let Some(v) = self.int()? {
                        dims.push(ShapeDim::Dim(Dim::Static(v)));
                    } else if let Some(n) = self.ident() {
                        dims.push(ShapeDim::Dim(Dim::sym(&n)));
                    } else {
                        return Err(self.err("expected a dim (`?`, an integer or a name)"));
                    }
                }
                p = self.b.shape(p, dims);
            } else {
                let at = self.i;
                let name = self
                    .ident()
                    .ok_or_else(|| self.err("expected a dtype or a shape `[...]`"))?;
                let d = DType::from_name(&name).ok_or_else(|| {
                    self.i = at;
                    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                    self.err(&format!("expected a dtype ({})", names.join(", ")))
                })?;
                p = self.b.dtype(p, d);
            }
        }
    }

    fn unary(&mut self) -> Result<PatId> {
        self.ws();
        if self.peek() == Some('!') {
            self.i += 1;
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(self.b.not(inner));
        }
        let mut p = self.atom()?;
        loop {
            self.ws();
            if self.peek() != Some('[') {
                return Ok(p);
            }
            self.i += 1;
            self.ws();
            let idx = if self.eat("?") {
                None
            } else {
                let v = self
                    .int()?
                    .ok_or_else(|| self.err("expected an index or `?`"))?;
                Some(u32::try_from(v).map_err(|_| self.err("expected a non-negative index"))?)
            };
            self.ws();
            if !self.eat("]") {
                return Err(self.err("expected `]`"));
            }
            p = self.b.tuple_get_item(p, idx);
        }
    }

    fn int(&mut self) -> Result<Option<i64>> {
        let start = self.i;
        if self.peek() == Some('-') {
            self.i += 1;
        }
        let digits = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        if self.i == digits {
            self.i = start;
            return Ok(None);
        }
        let text: String = self.chars[start..self.i].iter().map(|c| c.1).collect();
        text.parse::<i64>().map(Some).map_err(|_| {
            self.i = start;
            self.err("expected an integer that fits in 64 bits")
        })
    }

    fn atom(&mut self) -> Result<PatId> {
        self.ws();
        match self.peek() {
            Some('(') => {
                self.i += 1;
                self.ws();
                if self.eat(")") {
                    return Ok(self.b.tuple(Vec::new()));
                }
                let first = self.alt()?;
                self.ws();
                if self.eat(")") {
                    return Ok(first);
                }
                let mut fields = vec![first];
                loop {
                    self.ws();
                    if !self.eat(",") {
                        return Err(self.err("expected `,` or `)`"));
                    }
                    self.ws();
                    if self.eat(")") {
                        break;
                    }
                    fields.push(self.alt()?);
                    self.ws();
                    if self.eat(")") {
                        break;
                    }
                }
                Ok(self.b.tuple(fields))
            }
            Some(c) if c.is_alphabetic() || c == '_' => {
                let at = self.i;
                let mut name = self.ident().unwrap_or_default();
                if name == "_" {
                    return Ok(self.b.wildcard());
                }
                if name == "const" {
                    return Ok(self.b.constant());
                }
                if name == "var" {
                    self.ws();
                    if self.eat("(") {
                        self.ws();
                        let s = self.string()?;
                        self.ws();
                        if !self.eat(")") {
                            return Err(self.err("expected `)`"));
                        }
                        return Ok(self.b.var(Some(&s)));
                    }
                    return Ok(self.b.var(None));
                }
                while self.peek() == Some('.') {
                    self.i += 1;
                    let part = self
                        .ident()
                        .ok_or_else(|| self.err("expected a name after `.`"))?;
                    name.push('.');
                    name.push_str(&part);
                }
                let op = super::canonical_op(&name);
                // A name outside the op set matches calls of that opaque op (kept verbatim
                // by the parser); its attributes cannot be checked.
                let known = Op::signature(&op).is_some();
                self.ws();
                let mut attrs = Vec::new();
                if self.eat("{") {
                    loop {
                        self.ws();
                        if self.eat("}") {
                            break;
                        }
                        if !attrs.is_empty() {
                            if !self.eat(",") {
                                return Err(self.err("expected `,` or `}` in attributes"));
                            }
                            self.ws();
                        }
                        let key = self
                            .ident()
                            .ok_or_else(|| self.err("expected an attribute name"))?;
                        self.ws();
                        if !self.eat("=") {
                            return Err(self.err("expected `=` after the attribute name"));
                        }
                        self.ws();
                        let v = self.lit()?;
                        attrs.push((key, v));
                    }
                    // Check the names and values against the op's attributes.
                    if known && let Err(msg) = Op::from_call(&op, &attrs) {
                        self.i = at;
                        return Err(self.err(&format!("bad attributes for `{op}`: {msg}")));
                    }
                    self.ws();
                }
                if !self.eat("(") {
                    return Err(self.err(&format!("expected `(` after the op name `{op}`")));
                }
                let mut args = Vec::new();
                let mut at_least = false;
                loop {
                    self.ws();
                    if self.eat(")") {
                        break;
                    }
                    if !args.is_empty() || at_least {
                        if !self.eat(",") {
                            return Err(self.err("expected `,` or `)`"));
                        }
                        self.ws();
                    }
                    if self.eat("...") {
                        at_least = true;
                        self.ws();
                        if !self.eat(")") {
                            return Err(self.err("expected `)` after `...`"));
                        }
                        break;
                    }
                    args.push(self.alt()?);
                }
                Ok(self.b.add(PatNode::Call {
                    op,
                    args,
                    at_least,
                    attrs,
                }))
            }
            _ => Err(self.err("expected a pattern (`_`, `const`, `var`, an op call, `(`, or `!`)")),
        }
    }

    fn string(&mut self) -> Result<String> {
        if self.peek() != Some('"') {
            return Err(self.err("expected a string"));
        }
        self.i += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some('"') => {
                    self.i += 1;
                    return Ok(s);
                }
                Some('\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(c @ ('"' | '\\')) => s.push(c),
                        _ => return Err(self.err("expected `\\\"` or `\\\\` escape")),
                    }
                    self.i += 1;
                }
                Some(c) => {
                    s.push(c);
                    self.i += 1;
                }
            }
        }
    }

    fn lit(&mut self) -> Result<AttrLit> {
        self.ws();
        match self.peek() {
            Some('"') => Ok(AttrLit::Str(self.string()?)),
            Some('[') | Some('(') => {
                let close = if self.peek() == Some('[') { "]" } else { ")" };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.eat(close) {
                        break;
                    }
                    if !items.is_empty() {
                        if !self.eat(",") {
                            return Err(self.err(&format!("expected `,` or `{close}`")));
                        }
                        self.ws();
                        if self.eat(close) {
                            break;
                        }
                    }
                    items.push(self.lit()?);
                }
                Ok(AttrLit::List(items))
            }
            _ => {
                if self.keyword("True") {
                    return Ok(AttrLit::Bool(true));
                }
                if self.keyword("False") {
                    return Ok(AttrLit::Bool(false));
                }
                if self.keyword("None") {
                    return Ok(AttrLit::None);
                }
                let start = self.i;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_digit() || "+-.eE".contains(c))
                {
                    self.i += 1;
                }
                let text: String = self.chars[start..self.i].iter().map(|c| c.1).collect();
                if let Ok(v) = text.parse::<i64>() {
                    return Ok(AttrLit::Int(v));
                }
                if let Ok(v) = text.parse::<f64>()
                    && !text.is_empty()
                {
                    return Ok(AttrLit::Float(v));
                }
                self.i = start;
                Err(self.err("expected a literal (number, string, True, False, None or a list)"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(src: &str) -> String {
        match parse_pattern(src) {
            Ok(p) => {
                let printed = p.to_string();
                let again = parse_pattern(&printed).map(|q| q.to_string());
                assert_eq!(
                    again.as_deref().ok(),
                    Some(printed.as_str()),
                    "print → parse of {src}"
                );
                printed
            }
            Err(e) => panic!("{src}: {e}"),
        }
    }

    #[test]
    fn parses_and_prints_every_form() {
        assert_eq!(
            roundtrip("relax.nn.relu(relax.add(relax.nn.conv2d(_, const), _))"),
            "relax.nn.relu(relax.add(relax.nn.conv2d(_, const), _))"
        );
        assert_eq!(
            roundtrip("nn.relu(nn.conv2d(_, _))"),
            "relax.nn.relu(relax.nn.conv2d(_, _))"
        );
        assert_eq!(
            roundtrip("relax.nn.relu(_) | relax.nn.gelu(_)"),
            "relax.nn.relu(_) | relax.nn.gelu(_)"
        );
        assert_eq!(roundtrip("relax.split(_)[0]"), "relax.split(_)[0]");
        assert_eq!(roundtrip("relax.split(_)[?]"), "relax.split(_)[?]");
        assert_eq!(roundtrip("(_, const)"), "(_, const)");
        assert_eq!(
            roundtrip("relax.nn.conv2d{groups=1, data_layout=\"NHWC\"}(_, _)"),
            "relax.nn.conv2d{groups=1, data_layout=\"NHWC\"}(_, _)"
        );
        assert_eq!(roundtrip("_ : float16"), "_ : float16");
        assert_eq!(roundtrip("x @ _ : [?, 64]"), "x @ _ : [?, 64]");
        assert_eq!(
            roundtrip("relax.add(w @ _, w @ _)"),
            "relax.add(w @ _, w @ _)"
        );
        assert_eq!(roundtrip("!const & _"), "!const & _");
        assert_eq!(roundtrip("relax.concat(_, ...)"), "relax.concat(_, ...)");
        assert_eq!(roundtrip("var(\"x\") | var"), "var(\"x\") | var");
        assert_eq!(
            roundtrip("(a @ relax.nn.relu(_) | relax.nn.gelu(_)) & _"),
            "(a @ relax.nn.relu(_) | relax.nn.gelu(_)) & _"
        );
        assert_eq!(
            roundtrip("r @ relax.nn.relu(c @ relax.nn.conv2d(_, _)) where c >> r"),
            "r @ relax.nn.relu(c @ relax.nn.conv2d(_, _)) where c >> r"
        );
    }

    fn err(src: &str) -> (u32, String) {
        match parse_pattern(src) {
            Ok(p) => panic!("{src} parsed as {p}"),
            Err(e) => {
                let s = e.as_source().map(|s| (s.pos.col, s.message.clone()));
                s.unwrap_or((0, e.to_string()))
            }
        }
    }

    #[test]
    fn errors_name_the_position_and_what_was_expected() {
        // A name outside the op set names an opaque op; only its spelling is kept.
        assert_eq!(roundtrip("stack(_, _)"), "relax.stack(_, _)");
        assert_eq!(roundtrip("relax.foo{axis=1}(_)"), "relax.foo{axis=1}(_)");
        assert_eq!(
            err("relax.nn.relu(_"),
            (
                16,
                "expected `,` or `)`, found the end of the pattern".into()
            )
        );
        assert_eq!(err("_ : float33"), (5, "expected a dtype (float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool), found `f`".into()));
        assert_eq!(
            err("relax.add(_, _) _"),
            (
                17,
                "expected the end of the pattern, `|`, `&` or `where`, found `_`".into()
            )
        );
        assert!(
            err("relax.nn.conv2d{grops=1}(_, _)")
                .1
                .contains("no attribute `grops`")
        );
        assert_eq!(err("_[x]").0, 3);
        assert!(
            err("relax.nn.relu(_) where a >> b")
                .1
                .contains("not a capture")
        );
        assert!(err("").1.contains("expected a pattern"));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let src = "!".repeat(10_000) + "_";
        assert!(err(&src).1.contains("nests too deeply"));
        let src = "(".repeat(10_000);
        assert!(err(&src).1.contains("nests too deeply"));
    }
    #[test]
    fn deep_capture_and_suffix_chains_print_no_deeper_than_they_parse() {
        // Found by the parse_pattern fuzz target: the printer put each inner capture in
        // parentheses, doubling the nesting, so a pattern that parsed printed to one that did
        // not.
        for src in [
            "_ @ ".repeat(150) + "_",
            "_".to_string() + &" : float16".repeat(150),
            "relax.nn.relu(_)".to_string() + &" : [?, 4] : float32".repeat(100),
            "!".repeat(150) + "_",
            // Names and strings with characters Rust's `{:?}` escapes (`\0`, a newline).
            "var(\"a\0b\\\\c\\\"d\ne\")".to_string(),
        ] {
            let p = parse_pattern(&src).unwrap_or_else(|e| panic!("{e}"));
            let printed = p.to_string();
            let q = parse_pattern(&printed).unwrap_or_else(|e| panic!("{printed}: {e}"));
            assert_eq!(q.to_string(), printed);
        }
    }
}
