//! The recursive-descent parser of the text format (the TVMScript subset TVM 0.27 prints for
//! Relax modules).
//!
//! ```text
//! @I.ir_module
//! class Module:
//!     @R.function
//!     def main(x: R.Tensor(("n", 4), dtype="float32")) -> R.Tensor(("n", 4), dtype="float32"):
//!         n = T.int64()
//!         with R.dataflow():
//!             y = R.nn.relu(R.nn.relu(x))      # nested call: becomes `lv = R.nn.relu(x)` first
//!             R.output(y)
//!         return y
//! ```
//!
//! Contract: the parser builds a [`Module`] directly (no intermediate AST) in two phases: phase 1
//! reads every function header of the class (so calls may refer to functions defined later) and
//! skips the bodies; phase 2 elaborates the bodies, lazily elaborating a callee whose return
//! type is not annotated. Every expression gets its type from [`infer_kind`]; annotations must
//! accept the inferred type. Nested calls are normalised to A-normal form with fresh `lv`,
//! `lv1`, ... bindings. Every error is a positioned [`Error::source`]; nesting deeper than
//! [`MAX_DEPTH`] is an error, never a stack overflow. Linear time: name lookups are hash maps.

use super::constants::{ConstTable, side_file_path};
use super::lexer::{Tk, Token, lex, unescape};
use crate::error::{Error, Pos, Result};
use crate::ir::ShapeInterner;
use crate::ir::infer::{brief, infer_kind};
use crate::ir::{
    AttrValue, Binding, Block, Callee, Constant, DType, Dim, DimOp, ExprId, ExprKind, FuncAttrs,
    FuncType, Function, Module, PrimValue, Sym, TensorType, Type, VarId,
};
use crate::op::{AttrLit, Op};
use rustc_hash::{FxHashMap as FxMap, FxHashSet as FxSet};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// The deepest nesting (brackets, types, literals, nested functions) the parser accepts.
pub const MAX_DEPTH: u32 = 256;

/// Largest magnitude of a constant inside a dimension expression (inference keeps to it too).
const MAX_DIM_CONST: i64 = crate::ir::MAX_DIM;

/// Most binary operators in one dimension expression.
const MAX_DIM_OPS: u32 = 256;

const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Names the printer never gives a variable and the parser refuses as binding names.
pub(crate) fn is_reserved(name: &str) -> bool {
    PY_KEYWORDS.contains(&name) || matches!(name, "R" | "T" | "I" | "cls" | "metadata")
}

/// Symbolic dims visible while parsing one function.
#[derive(Clone, Debug, Default)]
struct SymEnv {
    visible: FxMap<String, Sym>,
    /// `n = T.int64()` lines of the body, in order.
    lines: Vec<Sym>,
    /// Every symbol the function uses, in first-use order.
    used: Vec<Sym>,
    used_set: FxSet<Sym>,
    /// In a signature: unknown names define new symbols.
    defining: bool,
}

impl SymEnv {
    fn child(&self) -> SymEnv {
        SymEnv {
            visible: self.visible.clone(),
            ..SymEnv::default()
        }
    }

    fn use_sym(&mut self, s: &Sym) {
        if self.used_set.insert(s.clone()) {
            self.used.push(s.clone());
        }
    }

    fn finish(self) -> Vec<Sym> {
        let in_lines: HashSet<&Sym> = self.lines.iter().collect();
        let mut out = self.lines.clone();
        out.extend(self.used.iter().filter(|s| !in_lines.contains(s)).cloned());
        out
    }
}

/// A function header: decorator, name, params and return annotation.
#[derive(Debug)]
struct Header<'a> {
    name: &'a str,
    name_tok: Token,
    private: bool,
    params: Vec<(&'a str, Type)>,
    ret: Option<(Type, Token)>,
    syms: SymEnv,
}

enum GState {
    Pending,
    InProgress,
    Done(Box<Function>),
}

struct Global<'a> {
    name: &'a str,
    header: Option<Header<'a>>,
    body_start: usize,
    state: GState,
}

/// Per-function parsing state.
struct FnCtx<'a> {
    f: Function,
    /// Name -> (var, visible). Dataflow vars of an ended block stay (to reject redefinition) but
    /// are invisible.
    scope: FxMap<Cow<'a, str>, (VarId, bool)>,
    fresh: u32,
    in_dataflow: bool,
    /// Equal shapes of this function's types share one dims list.
    shapes: ShapeInterner,
}

pub(crate) struct Parser<'a> {
    src: &'a str,
    file: &'a str,
    toks: Vec<Token>,
    i: usize,
    consts: &'a ConstTable,
    depth: u32,
    class_name: &'a str,
    module_syms: FxMap<String, Sym>,
    syms: SymEnv,
    globals: HashMap<String, FuncType>,
    funcs: Vec<Global<'a>>,
    by_name: FxMap<&'a str, usize>,
    lv_taken: FxSet<&'a str>,
    dim_ops: u32,
}

/// Byte offset to 1-based line:col (col in chars).
pub(crate) fn pos_at(src: &str, offset: usize) -> Pos {
    let offset = offset.min(src.len());
    let mut off = offset;
    while off > 0 && !src.is_char_boundary(off) {
        off -= 1;
    }
    let before = src.get(..off).unwrap_or("");
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let col = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    Pos {
        line: u32::try_from(line).unwrap_or(u32::MAX),
        col: u32::try_from(col).unwrap_or(u32::MAX),
    }
}

fn describe_kind(k: Tk) -> &'static str {
    match k {
        Tk::LParen => "`(`",
        Tk::RParen => "`)`",
        Tk::LBracket => "`[`",
        Tk::RBracket => "`]`",
        Tk::LBrace => "`{`",
        Tk::RBrace => "`}`",
        Tk::Comma => "`,`",
        Tk::Colon => "`:`",
        Tk::Eq => "`=`",
        Tk::Dot => "`.`",
        Tk::Arrow => "`->`",
        Tk::Plus => "`+`",
        Tk::Minus => "`-`",
        Tk::Star => "`*`",
        Tk::SlashSlash => "`//`",
        Tk::Percent => "`%`",
        Tk::At => "`@`",
        Tk::Newline => "end of line",
        Tk::Indent => "indentation",
        Tk::Dedent => "end of block",
        Tk::Eof => "end of input",
        Tk::Ident => "identifier",
        Tk::Int => "integer",
        Tk::Float => "float",
        Tk::Str => "string",
    }
}

fn is_leaf(kind: &ExprKind) -> bool {
    !matches!(
        kind,
        ExprKind::Call { .. } | ExprKind::TupleGetItem(..) | ExprKind::Function(_)
    )
}

fn has_syms(t: &Type) -> bool {
    let mut s = std::collections::BTreeSet::new();
    t.collect_syms(&mut s);
    !s.is_empty()
}

fn dim_in_range(d: &Dim) -> bool {
    match d {
        Dim::Static(v) => (-MAX_DIM_CONST..=MAX_DIM_CONST).contains(v),
        Dim::Sym(_) => true,
        Dim::Expr(e) => dim_in_range(&e.1) && dim_in_range(&e.2),
    }
}

fn dtype_of(name: &str) -> Option<DType> {
    DType::from_name(name)
}

impl<'a> Parser<'a> {
    pub(crate) fn new(src: &'a str, file: &'a str, consts: &'a ConstTable) -> Result<Self> {
        let toks = lex(src, 0, src.len(), false)
            .map_err(|(off, msg)| Error::source(file, src, pos_at(src, off), msg))?;
        let mut lv_taken = FxSet::default();
        for t in &toks {
            if t.kind == Tk::Ident {
                let s = src.get(t.start as usize..t.end as usize).unwrap_or("");
                if let Some(rest) = s.strip_prefix("lv")
                    && rest.bytes().all(|b| b.is_ascii_digit())
                {
                    lv_taken.insert(s);
                }
            }
        }
        Ok(Parser {
            src,
            file,
            toks,
            i: 0,
            consts,
            depth: 0,
            class_name: "Module",
            module_syms: FxMap::default(),
            syms: SymEnv::default(),
            globals: HashMap::new(),
            funcs: Vec::new(),
            by_name: FxMap::default(),
            lv_taken,
            dim_ops: 0,
        })
    }

    // ----- token helpers -----

    fn eof_tok(&self) -> Token {
        let n = self.src.len() as u32;
        Token {
            kind: Tk::Eof,
            start: n,
            end: n,
        }
    }

    fn peek(&self) -> Token {
        self.toks
            .get(self.i)
            .copied()
            .unwrap_or_else(|| self.eof_tok())
    }

    fn peek_at(&self, k: usize) -> Token {
        self.toks
            .get(self.i + k)
            .copied()
            .unwrap_or_else(|| self.eof_tok())
    }

    fn bump(&mut self) -> Token {
        let t = self.peek();
        if self.i < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn text(&self, t: Token) -> &'a str {
        self.src.get(t.start as usize..t.end as usize).unwrap_or("")
    }

    fn is_ident(&self, t: Token, s: &str) -> bool {
        t.kind == Tk::Ident && self.text(t) == s
    }

    fn describe(&self, t: Token) -> String {
        match t.kind {
            Tk::Ident | Tk::Int | Tk::Float => format!("`{}`", self.text(t)),
            Tk::Str => {
                let s = self.text(t);
                if s.chars().count() > 40 {
                    let short: String = s.chars().take(37).collect();
                    format!("string {short}...")
                } else {
                    format!("string {s}")
                }
            }
            k => describe_kind(k).to_string(),
        }
    }

    fn err_at(&self, t: Token, msg: impl Into<String>) -> Error {
        Error::source(self.file, self.src, pos_at(self.src, t.start as usize), msg)
    }

    fn err_off(&self, off: usize, msg: impl Into<String>) -> Error {
        Error::source(self.file, self.src, pos_at(self.src, off), msg)
    }

    fn expect(&mut self, kind: Tk, what: &str) -> Result<Token> {
        let t = self.peek();
        if t.kind == kind {
            Ok(self.bump())
        } else {
            Err(self.err_at(
                t,
                format!(
                    "expected {} {what}, found {}",
                    describe_kind(kind),
                    self.describe(t)
                ),
            ))
        }
    }

    fn expect_ident(&mut self, what: &str) -> Result<(Token, &'a str)> {
        let t = self.peek();
        if t.kind == Tk::Ident {
            self.bump();
            Ok((t, self.text(t)))
        } else {
            Err(self.err_at(t, format!("expected {what}, found {}", self.describe(t))))
        }
    }

    fn expect_kw(&mut self, kw: &str, what: &str) -> Result<Token> {
        let t = self.peek();
        if self.is_ident(t, kw) {
            Ok(self.bump())
        } else {
            Err(self.err_at(
                t,
                format!("expected `{kw}` {what}, found {}", self.describe(t)),
            ))
        }
    }

    fn expect_newline(&mut self, after: &str) -> Result<()> {
        let t = self.peek();
        if t.kind == Tk::Newline {
            self.bump();
            Ok(())
        } else {
            Err(self.err_at(
                t,
                format!(
                    "expected end of line after {after}, found {}",
                    self.describe(t)
                ),
            ))
        }
    }

    fn enter(&mut self, t: Token) -> Result<()> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err_at(
                t,
                format!("nesting is too deep (more than {MAX_DEPTH} levels)"),
            ));
        }
        self.depth += 1;
        Ok(())
    }

    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn skip_newlines(&mut self) {
        while self.peek().kind == Tk::Newline {
            self.bump();
        }
    }

    fn skip_line(&mut self) {
        while !matches!(self.peek().kind, Tk::Newline | Tk::Eof) {
            self.bump();
        }
        self.skip_newlines();
    }

    // ----- module level -----

    pub(crate) fn parse_module(mut self) -> Result<Module> {
        let mut seen_class = false;
        loop {
            let t = self.peek();
            match t.kind {
                Tk::Eof => break,
                Tk::Newline => {
                    self.bump();
                }
                Tk::Ident if matches!(self.text(t), "from" | "import") => self.skip_line(),
                Tk::Ident if self.peek_at(1).kind == Tk::Eq => {
                    if !self.try_sym_def(true)? {
                        return Err(self.err_at(
                            t,
                            format!(
                                "expected `{} = T.int64()` or an `@I.ir_module` class at the top level",
                                self.text(t)
                            ),
                        ));
                    }
                }
                Tk::At if !seen_class => {
                    self.parse_class_header()?;
                    seen_class = true;
                }
                Tk::At => {
                    return Err(self.err_at(
                        t,
                        "expected one `@I.ir_module` class, found a second decorator",
                    ));
                }
                _ => {
                    return Err(self.err_at(
                        t,
                        format!(
                            "expected an `@I.ir_module` class, found {}",
                            self.describe(t)
                        ),
                    ));
                }
            }
        }
        if !seen_class {
            let t = self.peek();
            return Err(self.err_at(t, "expected an `@I.ir_module` class, found end of input"));
        }
        for idx in 0..self.funcs.len() {
            self.elaborate(idx, None)?;
        }
        let mut m = Module::new();
        for g in std::mem::take(&mut self.funcs) {
            if let GState::Done(f) = g.state {
                m.insert(g.name, *f);
            }
        }
        Ok(m)
    }

    fn parse_dotted(&mut self) -> Result<String> {
        let (_, first) = self.expect_ident("a decorator name")?;
        let mut s = first.to_string();
        while self.peek().kind == Tk::Dot {
            self.bump();
            let (_, part) = self.expect_ident("a name after `.`")?;
            s.push('.');
            s.push_str(part);
        }
        Ok(s)
    }

    fn parse_class_header(&mut self) -> Result<()> {
        let at = self.expect(Tk::At, "before the module decorator")?;
        let name_tok = self.peek();
        let deco = self.parse_dotted()?;
        if !matches!(
            deco.as_str(),
            "I.ir_module" | "tvm.script.ir_module" | "ir_module"
        ) {
            return Err(self.err_at(
                name_tok,
                format!("expected `@I.ir_module` before the class, found `@{deco}`"),
            ));
        }
        if self.peek().kind == Tk::LParen {
            self.bump();
            self.expect(Tk::RParen, "after `@I.ir_module(`")?;
        }
        let _ = at;
        self.expect_newline("the decorator")?;
        self.skip_newlines();
        self.expect_kw("class", "after `@I.ir_module`")?;
        let (_, cname) = self.expect_ident("a class name")?;
        self.class_name = cname;
        if self.peek().kind == Tk::LParen {
            self.bump();
            self.expect(Tk::RParen, "after `class Name(`")?;
        }
        self.expect(Tk::Colon, "after the class name")?;
        self.expect_newline("`class ...:`")?;
        self.expect(Tk::Indent, "(an indented class body)")?;
        loop {
            let t = self.peek();
            match t.kind {
                Tk::Dedent => {
                    self.bump();
                    break;
                }
                Tk::Eof => break,
                Tk::Newline => {
                    self.bump();
                }
                Tk::Indent => return Err(self.err_at(t, "unexpected indentation")),
                Tk::Ident if self.text(t) == "pass" => {
                    self.bump();
                    self.expect_newline("`pass`")?;
                }
                Tk::Ident if self.peek_at(1).kind == Tk::Eq => {
                    if !self.try_sym_def(true)? {
                        return Err(self.err_at(
                            t,
                            format!(
                                "expected `{} = T.int64()` or a function in the class body",
                                self.text(t)
                            ),
                        ));
                    }
                }
                Tk::At => self.parse_global_function()?,
                _ => {
                    return Err(self.err_at(
                        t,
                        format!(
                            "expected a function definition (`@R.function`) in the class body, found {}",
                            self.describe(t)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `n = T.int64()`, `n = T.int32()` or `n = TypeVar("n")`. Returns false (consuming nothing)
    /// when the statement is not one of these.
    fn try_sym_def(&mut self, module_level: bool) -> Result<bool> {
        let name_tok = self.peek();
        if name_tok.kind != Tk::Ident || self.peek_at(1).kind != Tk::Eq {
            return Ok(false);
        }
        let a = self.peek_at(2);
        let is_t = self.is_ident(a, "T")
            && self.peek_at(3).kind == Tk::Dot
            && matches!(self.text(self.peek_at(4)), "int64" | "int32")
            && self.peek_at(5).kind == Tk::LParen
            && self.peek_at(6).kind == Tk::RParen;
        let is_tv = self.is_ident(a, "TypeVar") && self.peek_at(3).kind == Tk::LParen;
        if !is_t && !is_tv {
            return Ok(false);
        }
        let name = self.text(name_tok);
        if is_reserved(name) {
            return Err(self.err_at(name_tok, format!("`{name}` is a reserved name")));
        }
        if is_t {
            self.i += 7;
        } else {
            self.i += 4;
            let s = self.expect(Tk::Str, "in `TypeVar(...)`")?;
            let _ = s;
            self.expect(Tk::RParen, "after `TypeVar(\"...\"`")?;
        }
        self.expect_newline("the symbolic variable definition")?;
        let sym = Sym::new(name);
        if module_level {
            self.module_syms.insert(name.to_string(), sym);
        } else {
            self.syms.visible.insert(name.to_string(), sym.clone());
            if !self.syms.lines.contains(&sym) {
                self.syms.lines.push(sym);
            }
        }
        Ok(true)
    }

    /// `@R.function` / `@R.function(private=True)`; returns `private`.
    fn parse_function_decorator(&mut self) -> Result<bool> {
        self.expect(Tk::At, "before `R.function`")?;
        let t = self.peek();
        let deco = self.parse_dotted()?;
        if deco != "R.function" {
            return Err(self.err_at(t, format!("expected `@R.function`, found `@{deco}`")));
        }
        let mut private = false;
        if self.peek().kind == Tk::LParen {
            self.bump();
            while self.peek().kind != Tk::RParen {
                let (kt, key) = self.expect_ident("a decorator argument such as `private=True`")?;
                self.expect(Tk::Eq, "after the decorator argument name")?;
                let vt = self.peek();
                let val = if self.is_ident(vt, "True") {
                    true
                } else if self.is_ident(vt, "False") {
                    false
                } else {
                    return Err(self.err_at(
                        vt,
                        format!("expected `True` or `False`, found {}", self.describe(vt)),
                    ));
                };
                self.bump();
                match key {
                    "private" => private = val,
                    "pure" => {}
                    _ => {
                        return Err(self.err_at(
                            kt,
                            format!("unknown `R.function` argument `{key}`; expected `private` or `pure`"),
                        ));
                    }
                }
                if self.peek().kind == Tk::Comma {
                    self.bump();
                } else {
                    break;
                }
            }
            self.expect(Tk::RParen, "after the decorator arguments")?;
        }
        self.expect_newline("the decorator")?;
        self.skip_newlines();
        Ok(private)
    }

    /// `def name(params) -> ret:` with the function's own [`SymEnv`] installed in `self.syms`.
    fn parse_header(&mut self, private: bool) -> Result<Header<'a>> {
        self.expect_kw("def", "after the decorator")?;
        let (name_tok, name) = self.expect_ident("a function name after `def`")?;
        self.expect(Tk::LParen, "after the function name")?;
        self.syms.defining = true;
        let mut params: Vec<(&'a str, Type)> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        while self.peek().kind != Tk::RParen {
            let (pt, pname) = self.expect_ident("a parameter name")?;
            if is_reserved(pname) {
                return Err(self.err_at(pt, format!("`{pname}` is a reserved name")));
            }
            if !seen.insert(pname) {
                return Err(self.err_at(pt, format!("duplicate definition of `{pname}`")));
            }
            self.expect(Tk::Colon, "after parameter name")?;
            let ty = self.parse_type()?;
            params.push((pname, ty));
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RParen, "after the parameters")?;
        let ret = if self.peek().kind == Tk::Arrow {
            self.bump();
            let t = self.peek();
            Some((self.parse_type()?, t))
        } else {
            None
        };
        self.syms.defining = false;
        self.expect(Tk::Colon, "after the function signature")?;
        self.expect_newline("the function signature")?;
        let t = self.peek();
        if t.kind != Tk::Indent {
            return Err(self.err_at(
                t,
                format!(
                    "expected an indented function body, found {}",
                    self.describe(t)
                ),
            ));
        }
        self.bump();
        Ok(Header {
            name,
            name_tok,
            private,
            params,
            ret,
            syms: std::mem::take(&mut self.syms),
        })
    }

    fn parse_global_function(&mut self) -> Result<()> {
        let private = self.parse_function_decorator()?;
        self.syms = SymEnv {
            visible: self.module_syms.clone(),
            ..SymEnv::default()
        };
        let header = self.parse_header(private)?;
        if self.by_name.contains_key(header.name) {
            return Err(self.err_at(
                header.name_tok,
                format!("duplicate definition of function `{}`", header.name),
            ));
        }
        let body_start = self.i;
        // Skip the body: find the matching Dedent.
        let mut level = 1usize;
        loop {
            let t = self.bump();
            match t.kind {
                Tk::Indent => level += 1,
                Tk::Dedent => {
                    level -= 1;
                    if level == 0 {
                        break;
                    }
                }
                Tk::Eof => break,
                _ => {}
            }
        }
        if let Some((ret, _)) = &header.ret {
            let fty = FuncType {
                params: header.params.iter().map(|(_, t)| t.clone()).collect(),
                ret: Box::new(ret.clone()),
            };
            self.globals.insert(header.name.to_string(), fty);
        }
        self.by_name.insert(header.name, self.funcs.len());
        self.funcs.push(Global {
            name: header.name,
            header: Some(header),
            body_start,
            state: GState::Pending,
        });
        Ok(())
    }

    fn elaborate(&mut self, idx: usize, call: Option<Token>) -> Result<()> {
        let Some(g) = self.funcs.get_mut(idx) else {
            return Ok(());
        };
        match g.state {
            GState::Done(_) => return Ok(()),
            GState::InProgress => {
                let name = g.name;
                let t = call.unwrap_or_else(|| self.peek());
                return Err(self.err_at(
                    t,
                    format!(
                        "cannot infer the return type of `{name}`: it is called while its own body is being read; annotate it with `-> ...`"
                    ),
                ));
            }
            GState::Pending => {}
        }
        g.state = GState::InProgress;
        let body_start = g.body_start;
        let Some(header) = g.header.take() else {
            return Ok(());
        };
        let name = header.name;
        let saved_i = self.i;
        let saved_syms = std::mem::take(&mut self.syms);
        self.i = body_start;
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_function_body(&header, false);
        self.leave();
        self.i = saved_i;
        self.syms = saved_syms;
        let mut f = r?;
        // Provenance: every binding is the user's own `<function>/<var>`.
        f.set_origins(name);
        if header.ret.is_none() {
            self.globals.insert(name.to_string(), f.func_type());
        }
        if let Some(g) = self.funcs.get_mut(idx) {
            g.header = Some(header);
            g.state = GState::Done(Box::new(f));
        }
        Ok(())
    }

    // ----- function bodies -----

    /// Parses the statements of a body (the `Indent` is consumed) up to and including its
    /// `Dedent`. `self.syms` must hold the header's environment on entry.
    fn parse_function_body(&mut self, h: &Header<'a>, nested: bool) -> Result<Function> {
        self.syms = h.syms.clone();
        let mut ctx = FnCtx {
            f: Function::new(),
            scope: FxMap::default(),
            fresh: 0,
            in_dataflow: false,
            shapes: ShapeInterner::new(),
        };
        for (pname, ty) in &h.params {
            let ty = ctx.shapes.intern(ty.clone());
            let v = ctx.f.add_var(*pname, ty, false);
            ctx.f.params.push(v);
            ctx.scope.insert(Cow::Borrowed(*pname), (v, true));
        }
        ctx.f.attrs.global_symbol = (!nested && !h.private).then(|| h.name.to_string());
        loop {
            let t = self.peek();
            match t.kind {
                Tk::Newline => {
                    self.bump();
                }
                Tk::Indent => return Err(self.err_at(t, "unexpected indentation")),
                Tk::Dedent | Tk::Eof => {
                    return Err(self.err_at(
                        t,
                        format!(
                            "expected `return` at the end of function `{}`, found {}",
                            h.name,
                            self.describe(t)
                        ),
                    ));
                }
                Tk::Ident if self.text(t) == "return" => {
                    self.bump();
                    let et = self.peek();
                    let e = self.parse_expr(&mut ctx)?;
                    let e = self.leafify(&mut ctx, e)?;
                    self.expect_newline("the returned value")?;
                    self.skip_newlines();
                    let end = self.peek();
                    if end.kind != Tk::Dedent && end.kind != Tk::Eof {
                        return Err(self.err_at(
                            end,
                            format!(
                                "expected the end of function `{}` after `return`, found {}",
                                h.name,
                                self.describe(end)
                            ),
                        ));
                    }
                    self.bump();
                    let inferred = ctx.f.expr(e).ty.clone();
                    ctx.f.ret_ty = match &h.ret {
                        Some((ann, at)) => {
                            if !self.compatible(ann, &inferred, &ctx.f, e) {
                                return Err(self.err_at(
                                    *at,
                                    format!(
                                        "type mismatch: return annotation says {} but the returned value has type {}",
                                        brief(ann),
                                        brief(&inferred)
                                    ),
                                ));
                            }
                            let _ = et;
                            ann.clone()
                        }
                        None => inferred,
                    };
                    ctx.f.ret = Some(e);
                    break;
                }
                _ => self.parse_statement(&mut ctx, t)?,
            }
        }
        let syms = std::mem::take(&mut self.syms);
        ctx.f.sym_vars = syms.finish();
        Ok(ctx.f)
    }

    fn parse_statement(&mut self, ctx: &mut FnCtx<'a>, t: Token) -> Result<()> {
        match t.kind {
            Tk::At => self.parse_nested_function(ctx),
            Tk::Ident if self.text(t) == "with" => self.parse_dataflow(ctx),
            Tk::Ident if self.text(t) == "pass" => {
                self.bump();
                self.expect_newline("`pass`")
            }
            Tk::Ident
                if self.text(t) == "R"
                    && self.peek_at(1).kind == Tk::Dot
                    && self.is_ident(self.peek_at(2), "func_attr") =>
            {
                self.parse_func_attr(&mut ctx.f.attrs)
            }
            Tk::Ident if matches!(self.peek_at(1).kind, Tk::Colon | Tk::Eq) => {
                self.parse_binding(ctx)
            }
            _ => Err(self.err_at(
                t,
                format!(
                    "expected a binding `name: type = value` or `return`, found {}",
                    self.describe(t)
                ),
            )),
        }
    }

    fn parse_dataflow(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        let with = self.bump();
        if ctx.in_dataflow {
            return Err(self.err_at(with, "dataflow blocks cannot be nested"));
        }
        self.expect_kw("R", "after `with`")?;
        self.expect(Tk::Dot, "in `R.dataflow()`")?;
        self.expect_kw("dataflow", "after `with R.`")?;
        self.expect(Tk::LParen, "after `R.dataflow`")?;
        self.expect(Tk::RParen, "after `R.dataflow(`")?;
        self.expect(Tk::Colon, "after `with R.dataflow()`")?;
        self.expect_newline("`with R.dataflow():`")?;
        self.expect(Tk::Indent, "(an indented dataflow block)")?;
        let first_var = ctx.f.vars.len();
        ctx.f.blocks.push(Block {
            dataflow: true,
            bindings: Vec::new(),
        });
        ctx.in_dataflow = true;
        loop {
            let t = self.peek();
            match t.kind {
                Tk::Dedent => {
                    self.bump();
                    break;
                }
                Tk::Eof => break,
                Tk::Newline => {
                    self.bump();
                }
                Tk::Indent => return Err(self.err_at(t, "unexpected indentation")),
                Tk::Ident
                    if self.text(t) == "R"
                        && self.peek_at(1).kind == Tk::Dot
                        && self.is_ident(self.peek_at(2), "output") =>
                {
                    self.parse_output(ctx, first_var)?;
                    self.skip_newlines();
                    let end = self.peek();
                    if end.kind != Tk::Dedent && end.kind != Tk::Eof {
                        return Err(self.err_at(
                            end,
                            format!(
                                "expected the end of the dataflow block after `R.output(...)`, found {}",
                                self.describe(end)
                            ),
                        ));
                    }
                }
                Tk::Ident if self.text(t) == "return" => {
                    return Err(self.err_at(t, "`return` is not allowed inside a dataflow block"));
                }
                _ => self.parse_statement(ctx, t)?,
            }
        }
        ctx.in_dataflow = false;
        for idx in first_var..ctx.f.vars.len() {
            let v = <VarId as crate::ir::EntityId>::new(idx);
            let data = ctx.f.var(v);
            if data.dataflow
                && let Some(entry) = ctx.scope.get_mut(data.name.as_str())
                && entry.0 == v
            {
                entry.1 = false;
            }
        }
        Ok(())
    }

    fn parse_output(&mut self, ctx: &mut FnCtx<'a>, first_var: usize) -> Result<()> {
        self.i += 3;
        self.expect(Tk::LParen, "after `R.output`")?;
        while self.peek().kind != Tk::RParen {
            let (t, name) = self.expect_ident("a variable name in `R.output(...)`")?;
            let v = match ctx.scope.get(name) {
                Some(&(v, true)) if crate::ir::EntityId::index(v) >= first_var => v,
                _ => {
                    return Err(self.err_at(
                        t,
                        format!("`{name}` is not a variable bound in this dataflow block"),
                    ));
                }
            };
            ctx.f.vars[v].dataflow = false;
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RParen, "after the `R.output` variables")?;
        self.expect_newline("`R.output(...)`")
    }

    fn parse_func_attr(&mut self, attrs: &mut FuncAttrs) -> Result<()> {
        self.i += 3;
        self.expect(Tk::LParen, "after `R.func_attr`")?;
        self.expect(Tk::LBrace, "(a dict of attributes) in `R.func_attr(...)`")?;
        while self.peek().kind != Tk::RBrace {
            let kt = self.expect(Tk::Str, "(an attribute name)")?;
            let key =
                unescape(self.text(kt)).map_err(|(o, m)| self.err_off(kt.start as usize + o, m))?;
            self.expect(Tk::Colon, "after the attribute name")?;
            let vt = self.peek();
            let lit = self.parse_literal()?;
            let val = match lit {
                AttrLit::Str(s) => AttrValue::Str(s),
                AttrLit::Int(i) => AttrValue::Int(i),
                AttrLit::Float(f) => AttrValue::Float(f),
                AttrLit::Bool(b) => AttrValue::Bool(b),
                AttrLit::None | AttrLit::List(_) => {
                    return Err(self.err_at(
                        vt,
                        "unsupported function attribute value: expected a string, integer, float or bool",
                    ));
                }
            };
            let want_str = |p: &Self, v: AttrValue| -> Result<String> {
                match v {
                    AttrValue::Str(s) => Ok(s),
                    _ => Err(p.err_at(
                        vt,
                        format!("expected a string for `{key}`, found {}", p.describe(vt)),
                    )),
                }
            };
            match key.as_str() {
                "Composite" => attrs.composite = Some(want_str(self, val)?),
                "Codegen" => attrs.codegen = Some(want_str(self, val)?),
                "global_symbol" => attrs.global_symbol = Some(want_str(self, val)?),
                "Primitive" => attrs.primitive = Some(val),
                _ => {
                    attrs.extra.insert(key, val);
                }
            }
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RBrace, "after the attributes")?;
        self.expect(Tk::RParen, "after `R.func_attr({...}`")?;
        self.expect_newline("`R.func_attr(...)`")
    }

    fn parse_nested_function(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        let at = self.peek();
        self.enter(at)?;
        let r = self.parse_nested_function_inner(ctx);
        self.leave();
        r
    }

    fn parse_nested_function_inner(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        let private = self.parse_function_decorator()?;
        let outer = std::mem::take(&mut self.syms);
        self.syms = outer.child();
        let header = match self.parse_header(private) {
            Ok(h) => h,
            Err(e) => {
                self.syms = outer;
                return Err(e);
            }
        };
        if is_reserved(header.name) {
            self.syms = outer;
            return Err(self.err_at(
                header.name_tok,
                format!("`{}` is a reserved name", header.name),
            ));
        }
        if ctx.scope.contains_key(header.name) {
            self.syms = outer;
            return Err(self.err_at(
                header.name_tok,
                format!("duplicate definition of `{}`", header.name),
            ));
        }
        let r = self.parse_function_body(&header, true);
        self.syms = outer;
        let f = r?;
        // Symbols of the nested function are used by the outer one as well.
        let kind = ExprKind::Function(Box::new(f));
        let e = self.add_expr(ctx, kind, header.name_tok)?;
        let ty = ctx.f.expr(e).ty.clone();
        let v = ctx.f.add_var(header.name, ty, ctx.in_dataflow);
        Self::emit(ctx, v, e);
        ctx.scope.insert(Cow::Borrowed(header.name), (v, true));
        Ok(())
    }

    fn parse_binding(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        if self.try_sym_def(false)? {
            return Ok(());
        }
        let name_tok = self.bump();
        let name = self.text(name_tok);
        // `cls = Module`
        if name == "cls"
            && self.peek().kind == Tk::Eq
            && self.is_ident(self.peek_at(1), self.class_name)
            && self.peek_at(2).kind == Tk::Newline
        {
            self.i += 3;
            return Ok(());
        }
        if is_reserved(name) {
            return Err(self.err_at(
                name_tok,
                format!("expected a variable name, found reserved name `{name}`"),
            ));
        }
        let ann = if self.peek().kind == Tk::Colon {
            self.bump();
            let at = self.peek();
            Some((self.parse_type()?, at))
        } else {
            None
        };
        self.expect(Tk::Eq, "after the binding's variable")?;
        if ctx.scope.contains_key(name) {
            return Err(self.err_at(name_tok, format!("duplicate definition of `{name}`")));
        }
        let first = self.peek();
        let mut e = self.parse_expr(ctx)?;
        // A bare tuple, as TVM prints one bound to a var: `gv: R.Tuple(...) = lv4, lv9`.
        // Its fields are leaves, as in a parenthesised tuple: a nested call gets a binding.
        if self.peek().kind == Tk::Comma {
            let mut fields = vec![self.leafify(ctx, e)?];
            while self.peek().kind == Tk::Comma {
                self.bump();
                if self.peek().kind == Tk::Newline {
                    break;
                }
                fields.push(self.parse_arg(ctx)?);
            }
            e = self.add_expr(ctx, ExprKind::Tuple(fields), first)?;
        }
        self.expect_newline("the bound value")?;
        let inferred = ctx.f.expr(e).ty.clone();
        let ty = match ann {
            Some((ann, at)) => {
                if !self.compatible(&ann, &inferred, &ctx.f, e) {
                    return Err(self.err_at(
                        at,
                        format!(
                            "type mismatch: annotation says {} but the value has type {}",
                            brief(&ann),
                            brief(&inferred)
                        ),
                    ));
                }
                ann
            }
            None => inferred,
        };
        let ty = ctx.shapes.intern(ty);
        let v = ctx.f.add_var(name, ty, ctx.in_dataflow);
        Self::emit(ctx, v, e);
        ctx.scope.insert(Cow::Borrowed(name), (v, true));
        Ok(())
    }

    /// Whether annotation `ann` may be given to a value of inferred type `inferred`. Calls of
    /// functions whose types mention the callee's own symbolic dims are not checked (the
    /// inference does not substitute them).
    fn compatible(&self, ann: &Type, inferred: &Type, f: &Function, e: ExprId) -> bool {
        if ann.accepts(inferred) {
            return true;
        }
        let callee_call = |e: ExprId| {
            matches!(
                f.exprs.get(e).map(|d| &d.kind),
                Some(ExprKind::Call {
                    callee: Callee::Global(_) | Callee::Local(_),
                    ..
                })
            )
        };
        callee_call(e) && has_syms(inferred)
    }

    fn emit(ctx: &mut FnCtx<'a>, var: VarId, value: ExprId) {
        let b = Binding { var, value };
        match ctx.f.blocks.last_mut() {
            Some(block) if block.dataflow == ctx.in_dataflow => block.bindings.push(b),
            _ => ctx.f.blocks.push(Block {
                dataflow: ctx.in_dataflow,
                bindings: vec![b],
            }),
        }
    }

    fn add_expr(&mut self, ctx: &mut FnCtx<'a>, kind: ExprKind, at: Token) -> Result<ExprId> {
        let ty = infer_kind(&ctx.f, &self.globals, &kind).map_err(|m| {
            // The op set's messages may already start with the op name.
            let mut m = m;
            if let ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } = &kind
                && let Some(rest) = m.strip_prefix(&format!("{}: ", op.name()))
            {
                m = rest.to_string();
            }
            let what = match &kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    ..
                } => format!("type error in `{}`: ", op.name()),
                ExprKind::Call {
                    callee: Callee::Global(g),
                    ..
                } => format!("type error in call of `{g}`: "),
                ExprKind::Call { .. } => "type error in call: ".to_string(),
                _ => "type error: ".to_string(),
            };
            self.err_at(at, format!("{what}{m}"))
        })?;
        let ty = ctx.shapes.intern(ty);
        Ok(ctx.f.add_expr(kind, ty))
    }

    fn fresh_name(&self, ctx: &mut FnCtx<'a>) -> String {
        loop {
            let name = if ctx.fresh == 0 {
                "lv".to_string()
            } else {
                format!("lv{}", ctx.fresh)
            };
            ctx.fresh = ctx.fresh.wrapping_add(1);
            if !ctx.scope.contains_key(name.as_str()) && !self.lv_taken.contains(name.as_str()) {
                return name;
            }
        }
    }

    /// Binds a non-leaf expression to a fresh var and returns the var's expression.
    fn leafify(&mut self, ctx: &mut FnCtx<'a>, e: ExprId) -> Result<ExprId> {
        let Some(data) = ctx.f.exprs.get(e) else {
            return Ok(e);
        };
        if is_leaf(&data.kind) {
            return Ok(e);
        }
        let ty = data.ty.clone();
        let name = self.fresh_name(ctx);
        let v = ctx.f.add_var(name.clone(), ty, ctx.in_dataflow);
        Self::emit(ctx, v, e);
        ctx.scope.insert(Cow::Owned(name), (v, true));
        Ok(ctx.f.var_expr(v))
    }

    // ----- expressions -----

    fn parse_expr(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_expr_inner(ctx);
        self.leave();
        r
    }

    fn parse_arg(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let e = self.parse_expr(ctx)?;
        self.leafify(ctx, e)
    }

    fn parse_expr_inner(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let mut e = self.parse_primary(ctx)?;
        while self.peek().kind == Tk::LBracket {
            let lb = self.bump();
            let it = self.expect(Tk::Int, "(a tuple index) after `[`")?;
            let idx: u32 = self.text(it).parse().map_err(|_| {
                self.err_at(it, format!("tuple index `{}` is too large", self.text(it)))
            })?;
            self.expect(Tk::RBracket, "after the tuple index")?;
            let base = self.leafify(ctx, e)?;
            e = self.add_expr(ctx, ExprKind::TupleGetItem(base, idx), lb)?;
        }
        Ok(e)
    }

    fn parse_primary(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.peek();
        match t.kind {
            Tk::Ident => {
                let name = self.text(t);
                let next = self.peek_at(1).kind;
                if name == "R" && next == Tk::Dot {
                    return self.parse_r_expr(ctx);
                }
                if name == "metadata" && next == Tk::LBracket {
                    return self.parse_metadata(ctx);
                }
                if (name == "cls" || name == self.class_name) && next == Tk::Dot {
                    return self.parse_global_call(ctx);
                }
                if next == Tk::LParen && !ctx.scope.contains_key(name) && name == "T" {
                    return Err(self.err_at(t, "expected an expression, found `T`"));
                }
                if matches!(name, "True" | "False" | "None") {
                    return Err(self.err_at(t, format!("expected an expression, found `{name}`")));
                }
                if matches!(name, "inf" | "nan") && !ctx.scope.contains_key(name) {
                    let v = if name == "inf" {
                        f64::INFINITY
                    } else {
                        f64::NAN
                    };
                    self.bump();
                    return self.add_expr(ctx, ExprKind::Prim(PrimValue::Float(v, DType::F32)), t);
                }
                if name == "T" && next == Tk::Dot {
                    let (lit, dt) = self.parse_t_literal()?;
                    let pv = match lit {
                        AttrLit::Int(i) => PrimValue::Int(i),
                        AttrLit::Float(f) => PrimValue::Float(f, dt),
                        _ => {
                            return Err(self.err_at(t, "expected a numeric `T.<dtype>(...)` value"));
                        }
                    };
                    return self.add_expr(ctx, ExprKind::Prim(pv), t);
                }
                let v = self.lookup_var(ctx, t)?;
                self.bump();
                if self.peek().kind == Tk::LParen {
                    return self.parse_local_call(ctx, v, t);
                }
                Ok(ctx.f.var_expr(v))
            }
            Tk::Int | Tk::Float | Tk::Minus => {
                let lit = self.parse_literal()?;
                let pv = match lit {
                    AttrLit::Int(i) => PrimValue::Int(i),
                    AttrLit::Float(f) => PrimValue::Float(f, DType::F32),
                    _ => return Err(self.err_at(t, "expected a number")),
                };
                self.add_expr(ctx, ExprKind::Prim(pv), t)
            }
            Tk::LParen => {
                self.bump();
                if self.peek().kind == Tk::RParen {
                    self.bump();
                    return self.add_expr(ctx, ExprKind::Tuple(Vec::new()), t);
                }
                let first = self.parse_expr(ctx)?;
                if self.peek().kind == Tk::RParen {
                    self.bump();
                    return Ok(first);
                }
                let mut fields = vec![self.leafify(ctx, first)?];
                while self.peek().kind == Tk::Comma {
                    self.bump();
                    if self.peek().kind == Tk::RParen {
                        break;
                    }
                    fields.push(self.parse_arg(ctx)?);
                }
                self.expect(Tk::RParen, "after the tuple fields")?;
                self.add_expr(ctx, ExprKind::Tuple(fields), t)
            }
            Tk::Str => Err(self.err_at(
                t,
                format!(
                    "expected an expression, found {}; write R.str(...) for a string value",
                    self.describe(t)
                ),
            )),
            _ => Err(self.err_at(
                t,
                format!("expected an expression, found {}", self.describe(t)),
            )),
        }
    }

    fn lookup_var(&self, ctx: &FnCtx<'a>, t: Token) -> Result<VarId> {
        let name = self.text(t);
        match ctx.scope.get(name) {
            Some(&(v, true)) => Ok(v),
            Some(&(_, false)) => Err(self.err_at(
                t,
                format!("`{name}` is a dataflow variable of an earlier dataflow block and is not visible here"),
            )),
            None => Err(self.err_at(t, format!("undefined variable `{name}`"))),
        }
    }

    fn parse_call_args(&mut self, ctx: &mut FnCtx<'a>, what: &str) -> Result<Vec<ExprId>> {
        self.expect(Tk::LParen, what)?;
        let mut args = Vec::new();
        while self.peek().kind != Tk::RParen {
            let t = self.peek();
            if t.kind == Tk::Ident && self.peek_at(1).kind == Tk::Eq {
                return Err(self.err_at(t, "keyword arguments are only allowed in op calls"));
            }
            args.push(self.parse_arg(ctx)?);
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RParen, "after the call arguments")?;
        Ok(args)
    }

    fn parse_local_call(&mut self, ctx: &mut FnCtx<'a>, v: VarId, t: Token) -> Result<ExprId> {
        if !matches!(ctx.f.var(v).ty, Type::Func(_)) {
            return Err(self.err_at(
                t,
                format!(
                    "`{}` is not a function; it has type {}",
                    self.text(t),
                    brief(&ctx.f.var(v).ty)
                ),
            ));
        }
        let args = self.parse_call_args(ctx, "after the function name")?;
        self.add_expr(
            ctx,
            ExprKind::Call {
                callee: Callee::Local(v),
                args,
            },
            t,
        )
    }

    fn parse_global_call(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.bump();
        self.expect(Tk::Dot, "after `cls`")?;
        let (nt, name) = self.expect_ident("a function name after `cls.`")?;
        if !self.globals.contains_key(name) {
            match self.by_name.get(name).copied() {
                Some(idx) => {
                    self.enter(nt)?;
                    let r = self.elaborate(idx, Some(nt));
                    self.leave();
                    r?;
                }
                None => {
                    return Err(
                        self.err_at(nt, format!("no function named `{name}` in the module"))
                    );
                }
            }
        }
        if self.peek().kind != Tk::LParen {
            return Err(self.err_at(
                self.peek(),
                format!("expected `(` to call `{name}`, found {} (function references are not supported)", self.describe(self.peek())),
            ));
        }
        let args = self.parse_call_args(ctx, "after the function name")?;
        self.add_expr(
            ctx,
            ExprKind::Call {
                callee: Callee::Global(Arc::from(name)),
                args,
            },
            t,
        )
    }

    fn parse_metadata(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.bump();
        self.expect(Tk::LBracket, "after `metadata`")?;
        let st = self.expect(Tk::Str, "(a metadata namespace) after `metadata[`")?;
        let ns =
            unescape(self.text(st)).map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
        self.expect(Tk::RBracket, "after the metadata namespace")?;
        self.expect(Tk::LBracket, "after `metadata[...]`")?;
        let it = self.expect(Tk::Int, "(a constant index)")?;
        self.expect(Tk::RBracket, "after the constant index")?;
        let idx: Option<usize> = self.text(it).parse().ok();
        let c = idx.and_then(|i| self.consts.get(&ns, i)).cloned();
        let Some(c) = c else {
            let where_ = if self.file == "<input>" {
                "no constant table was given for this text".to_string()
            } else {
                format!(
                    "expected it in the side file `{}`, which is missing or does not hold it",
                    side_file_path(Path::new(self.file)).display()
                )
            };
            return Err(self.err_at(
                t,
                format!(
                    "no value for metadata[{}][{}]: {where_}",
                    super::lexer::quote(&ns),
                    self.text(it)
                ),
            ));
        };
        self.add_expr(ctx, ExprKind::Const(c), t)
    }

    /// `R.<path>(...)`: special forms and op calls.
    fn parse_r_expr(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.bump();
        let mut path = String::new();
        while self.peek().kind == Tk::Dot {
            self.bump();
            let (_, part) = self.expect_ident("a name after `.`")?;
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(part);
        }
        match path.as_str() {
            "const" => self.parse_const(ctx, t),
            "shape" => {
                self.expect(Tk::LParen, "after `R.shape`")?;
                let dims = self.parse_dim_list()?;
                self.expect(Tk::RParen, "after the shape values")?;
                self.add_expr(ctx, ExprKind::ShapeLit(dims), t)
            }
            "prim_value" => {
                self.expect(Tk::LParen, "after `R.prim_value`")?;
                let lt = self.peek();
                let pv = if self.is_ident(lt, "T") {
                    let (lit, dt) = self.parse_t_literal()?;
                    match lit {
                        AttrLit::Int(i) => PrimValue::Int(i),
                        AttrLit::Float(f) => PrimValue::Float(f, dt),
                        _ => return Err(self.err_at(lt, "expected a number")),
                    }
                } else {
                    match self.parse_literal()? {
                        AttrLit::Int(i) => PrimValue::Int(i),
                        AttrLit::Float(f) => PrimValue::Float(f, DType::F32),
                        _ => {
                            return Err(self.err_at(
                                lt,
                                format!(
                                    "expected a number in `R.prim_value(...)`, found {}",
                                    self.describe(lt)
                                ),
                            ));
                        }
                    }
                };
                self.expect(Tk::RParen, "after the prim value")?;
                self.add_expr(ctx, ExprKind::Prim(pv), t)
            }
            "str" => {
                self.expect(Tk::LParen, "after `R.str`")?;
                let st = self.expect(Tk::Str, "(a string) in `R.str(...)`")?;
                let s = unescape(self.text(st))
                    .map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
                self.expect(Tk::RParen, "after the string")?;
                self.add_expr(ctx, ExprKind::Prim(PrimValue::Str(s)), t)
            }
            "tuple" => {
                let fields = self.parse_call_args(ctx, "after `R.tuple`")?;
                self.add_expr(ctx, ExprKind::Tuple(fields), t)
            }
            "output" | "dataflow" | "func_attr" | "function" => {
                Err(self.err_at(t, format!("`R.{path}` is not an expression here")))
            }
            _ => self.parse_op_call(ctx, t, &path),
        }
    }

    fn parse_op_call(&mut self, ctx: &mut FnCtx<'a>, t: Token, path: &str) -> Result<ExprId> {
        let name = format!("relax.{path}");
        let Some(sig) = Op::signature(&name) else {
            return Err(self.err_at(t, format!("unknown op `{name}`")));
        };
        if self.peek().kind != Tk::LParen {
            let p = self.peek();
            return Err(self.err_at(
                p,
                format!("expected `(` after `R.{path}`, found {}", self.describe(p)),
            ));
        }
        self.bump();
        let mut args: Vec<ExprId> = Vec::new();
        let mut kwargs: Vec<(String, AttrLit)> = Vec::new();
        let mut positional = 0usize;
        let mut saw_kw = false;
        while self.peek().kind != Tk::RParen {
            let at = self.peek();
            if at.kind == Tk::Ident && self.peek_at(1).kind == Tk::Eq {
                let key = self.text(at);
                self.i += 2;
                let lit = self.parse_literal()?;
                if kwargs.iter().any(|(k, _)| k == key) {
                    return Err(
                        self.err_at(at, format!("attribute `{key}` of `{name}` is given twice"))
                    );
                }
                kwargs.push((key.to_string(), lit));
                saw_kw = true;
            } else {
                if saw_kw {
                    return Err(self.err_at(at, "positional argument after keyword arguments"));
                }
                if positional < sig.max_args {
                    args.push(self.parse_arg(ctx)?);
                } else {
                    let Some(attr) = sig.attr_names.get(positional - sig.max_args) else {
                        return Err(self.err_at(
                            at,
                            format!(
                                "`{name}` takes at most {} positional arguments ({} expressions and {} attributes), found more",
                                sig.max_args + sig.attr_names.len(),
                                sig.max_args,
                                sig.attr_names.len()
                            ),
                        ));
                    };
                    let lit = self.parse_literal()?;
                    kwargs.push(((*attr).to_string(), lit));
                }
                positional += 1;
            }
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RParen, "after the op arguments")?;
        if args.len() < sig.min_args {
            let want = if sig.min_args == sig.max_args {
                format!("{}", sig.min_args)
            } else {
                format!("{} to {}", sig.min_args, sig.max_args)
            };
            return Err(self.err_at(
                t,
                format!("`{name}` expects {want} arguments, found {}", args.len()),
            ));
        }
        let op = Op::from_call(&name, &kwargs)
            .map_err(|m| self.err_at(t, format!("invalid call of `{name}`: {m}")))?;
        self.add_expr(
            ctx,
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            },
            t,
        )
    }

    fn parse_const(&mut self, ctx: &mut FnCtx<'a>, t: Token) -> Result<ExprId> {
        self.expect(Tk::LParen, "after `R.const`")?;
        let vt = self.peek();
        let lit = self.parse_literal()?;
        let mut dtype: Option<DType> = None;
        if self.peek().kind == Tk::Comma {
            self.bump();
            if self.peek().kind != Tk::RParen {
                let dt = self.peek();
                if self.is_ident(dt, "dtype") && self.peek_at(1).kind == Tk::Eq {
                    self.i += 2;
                }
                let st = self.expect(Tk::Str, "(a dtype) in `R.const(...)`")?;
                let s = unescape(self.text(st))
                    .map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
                dtype = Some(
                    dtype_of(&s)
                        .ok_or_else(|| self.err_at(st, format!("unknown dtype \"{s}\"")))?,
                );
                if self.peek().kind == Tk::Comma {
                    self.bump();
                }
            }
        }
        self.expect(Tk::RParen, "after the constant")?;
        let c = match lit {
            AttrLit::Int(i) => Constant::scalar_i64(i, dtype.unwrap_or(DType::I64)),
            AttrLit::Float(f) => Constant::scalar(f, dtype.unwrap_or(DType::F32)),
            AttrLit::Bool(b) => {
                Constant::scalar(if b { 1.0 } else { 0.0 }, dtype.unwrap_or(DType::Bool))
            }
            _ => {
                return Err(self.err_at(
                    vt,
                    format!(
                        "expected a scalar number or bool in `R.const(...)`, found {}",
                        self.describe(vt)
                    ),
                ));
            }
        };
        self.add_expr(ctx, ExprKind::Const(c), t)
    }

    // ----- literals -----

    /// `T.int64(3)`, `T.float32(0.5)`: returns the value and the dtype.
    fn parse_t_literal(&mut self) -> Result<(AttrLit, DType)> {
        self.bump();
        self.expect(Tk::Dot, "after `T`")?;
        let (dt_tok, dt) = self.expect_ident("a dtype after `T.`")?;
        let dtype =
            dtype_of(dt).ok_or_else(|| self.err_at(dt_tok, format!("unknown dtype `T.{dt}`")))?;
        self.expect(Tk::LParen, &format!("after `T.{dt}`"))?;
        let vt = self.peek();
        let lit = self.parse_literal()?;
        self.expect(Tk::RParen, "after the value")?;
        let lit = match (lit, dtype.is_float()) {
            (AttrLit::Int(i), true) => AttrLit::Float(i as f64),
            (AttrLit::Int(i), false) => AttrLit::Int(i),
            (AttrLit::Float(f), true) => AttrLit::Float(f),
            (AttrLit::Bool(b), false) => AttrLit::Int(i64::from(b)),
            _ => {
                return Err(self.err_at(
                    vt,
                    format!(
                        "expected a number for `T.{dt}(...)`, found {}",
                        self.describe(vt)
                    ),
                ));
            }
        };
        Ok((lit, dtype))
    }

    fn parse_literal(&mut self) -> Result<AttrLit> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_literal_inner();
        self.leave();
        r
    }

    fn parse_number(&mut self, neg: bool) -> Result<AttrLit> {
        let t = self.peek();
        match t.kind {
            Tk::Int => {
                self.bump();
                let v: i128 = self.text(t).parse().map_err(|_| {
                    self.err_at(
                        t,
                        format!("integer literal `{}` is too large", self.text(t)),
                    )
                })?;
                let v = if neg { -v } else { v };
                let v = i64::try_from(v).map_err(|_| {
                    self.err_at(
                        t,
                        format!("integer literal `{}` does not fit in int64", self.text(t)),
                    )
                })?;
                Ok(AttrLit::Int(v))
            }
            Tk::Float => {
                self.bump();
                let v: f64 = self.text(t).parse().map_err(|_| {
                    self.err_at(t, format!("invalid float literal `{}`", self.text(t)))
                })?;
                Ok(AttrLit::Float(if neg { -v } else { v }))
            }
            Tk::Ident if matches!(self.text(t), "inf" | "nan") => {
                self.bump();
                let v = if self.text(t) == "inf" {
                    f64::INFINITY
                } else {
                    f64::NAN
                };
                Ok(AttrLit::Float(if neg { -v } else { v }))
            }
            _ => Err(self.err_at(
                t,
                format!("expected a number after `-`, found {}", self.describe(t)),
            )),
        }
    }

    fn parse_literal_inner(&mut self) -> Result<AttrLit> {
        let t = self.peek();
        match t.kind {
            Tk::Int | Tk::Float => self.parse_number(false),
            Tk::Minus => {
                self.bump();
                self.parse_number(true)
            }
            Tk::Str => {
                self.bump();
                let s = unescape(self.text(t)).map_err(|(o, m)| self.err_off(t.start as usize + o, m))?;
                Ok(AttrLit::Str(s))
            }
            Tk::Ident => match self.text(t) {
                "True" => {
                    self.bump();
                    Ok(AttrLit::Bool(true))
                }
                "False" => {
                    self.bump();
                    Ok(AttrLit::Bool(false))
                }
                "None" => {
                    self.bump();
                    Ok(AttrLit::None)
                }
                "inf" | "nan" => self.parse_number(false),
                "T" if self.peek_at(1).kind == Tk::Dot => Ok(self.parse_t_literal()?.0),
                "float" if self.peek_at(1).kind == Tk::LParen => {
                    self.i += 2;
                    let st = self.expect(Tk::Str, "in `float(...)`")?;
                    let s = unescape(self.text(st)).map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
                    self.expect(Tk::RParen, "after `float(\"...\"`")?;
                    let v: f64 = match s.trim().to_ascii_lowercase().as_str() {
                        "inf" | "+inf" | "infinity" => f64::INFINITY,
                        "-inf" | "-infinity" => f64::NEG_INFINITY,
                        "nan" => f64::NAN,
                        other => other
                            .parse()
                            .map_err(|_| self.err_at(st, format!("invalid float `{s}`")))?,
                    };
                    Ok(AttrLit::Float(v))
                }
                _ => Err(self.err_at(
                    t,
                    format!(
                        "expected a literal attribute value (number, string, True/False/None or list), found {}",
                        self.describe(t)
                    ),
                )),
            },
            Tk::LBracket | Tk::LParen => {
                let close = if t.kind == Tk::LBracket { Tk::RBracket } else { Tk::RParen };
                self.bump();
                let mut items = Vec::new();
                let mut comma = false;
                while self.peek().kind != close {
                    items.push(self.parse_literal()?);
                    if self.peek().kind == Tk::Comma {
                        self.bump();
                        comma = true;
                    } else {
                        break;
                    }
                }
                self.expect(close, "after the list items")?;
                if t.kind == Tk::LParen && !comma && items.len() == 1 {
                    return Ok(items.pop().unwrap_or(AttrLit::None));
                }
                Ok(AttrLit::List(items))
            }
            _ => Err(self.err_at(
                t,
                format!(
                    "expected a literal attribute value (number, string, True/False/None or list), found {}",
                    self.describe(t)
                ),
            )),
        }
    }

    // ----- types -----

    fn parse_type(&mut self) -> Result<Type> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_type_inner();
        self.leave();
        r
    }

    fn type_error(&self, t: Token) -> Error {
        self.err_at(
            t,
            format!(
                "expected R.Tensor(...) type annotation (or R.Tuple, R.Shape, R.Prim, R.Object, R.Callable), found {}",
                self.describe(t)
            ),
        )
    }

    fn parse_type_inner(&mut self) -> Result<Type> {
        let t = self.peek();
        if !self.is_ident(t, "R") || self.peek_at(1).kind != Tk::Dot {
            return Err(self.type_error(t));
        }
        self.i += 2;
        let nt = self.peek();
        if nt.kind != Tk::Ident {
            return Err(self.type_error(nt));
        }
        self.bump();
        let has_args = self.peek().kind == Tk::LParen;
        match self.text(nt) {
            "Tensor" => {
                if !has_args {
                    return Ok(Type::Tensor(TensorType {
                        dims: None,
                        ndim: None,
                        dtype: None,
                    }));
                }
                self.parse_tensor_args()
            }
            "Tuple" => {
                let mut fields = Vec::new();
                if has_args {
                    self.bump();
                    while self.peek().kind != Tk::RParen {
                        fields.push(self.parse_type()?);
                        if self.peek().kind == Tk::Comma {
                            self.bump();
                        } else {
                            break;
                        }
                    }
                    self.expect(Tk::RParen, "after the tuple field types")?;
                }
                Ok(Type::Tuple(fields))
            }
            "Shape" => {
                if !has_args {
                    return Ok(Type::Shape {
                        dims: None,
                        ndim: None,
                    });
                }
                self.bump();
                let at = self.peek();
                let ty = if self.is_ident(at, "ndim") && self.peek_at(1).kind == Tk::Eq {
                    self.i += 2;
                    let ndim = self.parse_ndim()?;
                    Type::Shape { dims: None, ndim }
                } else if matches!(at.kind, Tk::LBracket | Tk::LParen) {
                    Type::shape(self.parse_type_dims()?)
                } else if at.kind == Tk::RParen {
                    Type::Shape {
                        dims: None,
                        ndim: None,
                    }
                } else {
                    return Err(self.err_at(
                        at,
                        format!(
                            "expected `[...]` or `ndim=` in R.Shape(...), found {}",
                            self.describe(at)
                        ),
                    ));
                };
                self.expect(Tk::RParen, "after the R.Shape arguments")?;
                Ok(ty)
            }
            "Prim" => {
                self.expect(Tk::LParen, "after `R.Prim`")?;
                let dt = self.peek();
                if self.is_ident(dt, "dtype") && self.peek_at(1).kind == Tk::Eq {
                    self.i += 2;
                }
                let st = self.expect(Tk::Str, "(a dtype) in `R.Prim(...)`")?;
                let s = unescape(self.text(st))
                    .map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
                let d = dtype_of(&s)
                    .ok_or_else(|| self.err_at(st, format!("unknown dtype \"{s}\"")))?;
                self.expect(Tk::RParen, "after the dtype")?;
                Ok(Type::Prim(d))
            }
            "Object" => Ok(Type::Object),
            "Callable" => {
                self.expect(Tk::LParen, "after `R.Callable`")?;
                self.expect(Tk::LParen, "(the parameter types) in `R.Callable(...)`")?;
                let mut params = Vec::new();
                while self.peek().kind != Tk::RParen {
                    params.push(self.parse_type()?);
                    if self.peek().kind == Tk::Comma {
                        self.bump();
                    } else {
                        break;
                    }
                }
                self.expect(Tk::RParen, "after the parameter types")?;
                self.expect(Tk::Comma, "after the parameter types")?;
                let ret = self.parse_type()?;
                if self.peek().kind == Tk::Comma {
                    self.bump();
                }
                self.expect(Tk::RParen, "after the return type")?;
                Ok(Type::Func(FuncType {
                    params,
                    ret: Box::new(ret),
                }))
            }
            _ => Err(self.type_error(t)),
        }
    }

    fn parse_ndim(&mut self) -> Result<Option<usize>> {
        let t = self.peek();
        match self.parse_literal()? {
            AttrLit::Int(-1) => Ok(None),
            AttrLit::Int(n) if (0..=1 << 16).contains(&n) => Ok(usize::try_from(n).ok()),
            _ => Err(self.err_at(
                t,
                format!(
                    "expected a rank (a non-negative integer or -1), found {}",
                    self.describe(t)
                ),
            )),
        }
    }

    fn parse_dtype_str(&mut self) -> Result<Option<DType>> {
        let st = self.expect(Tk::Str, "(a dtype string)")?;
        let s = unescape(self.text(st)).map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
        if s == "void" || s.is_empty() {
            return Ok(None);
        }
        dtype_of(&s)
            .map(Some)
            .ok_or_else(|| self.err_at(st, format!("unknown dtype \"{s}\"")))
    }

    fn parse_tensor_args(&mut self) -> Result<Type> {
        self.bump(); // (
        let mut dims: Option<Vec<Dim>> = None;
        let mut dtype: Option<DType> = None;
        let mut ndim: Option<usize> = None;
        let mut positional = 0usize;
        while self.peek().kind != Tk::RParen {
            let t = self.peek();
            if t.kind == Tk::Ident && self.peek_at(1).kind == Tk::Eq {
                let key = self.text(t);
                self.i += 2;
                match key {
                    "dtype" => dtype = self.parse_dtype_str()?,
                    "ndim" => ndim = self.parse_ndim()?,
                    "shape" => {
                        if self.is_ident(self.peek(), "None") {
                            self.bump();
                        } else {
                            dims = Some(self.parse_type_dims()?);
                        }
                    }
                    _ => {
                        return Err(self.err_at(
                            t,
                            format!("unknown R.Tensor argument `{key}`; expected `shape`, `dtype` or `ndim`"),
                        ));
                    }
                }
            } else {
                match (positional, t.kind) {
                    (0, Tk::LParen | Tk::LBracket) => dims = Some(self.parse_type_dims()?),
                    (0, Tk::Ident) if self.text(t) == "None" => {
                        self.bump();
                    }
                    (0 | 1, Tk::Str) => dtype = self.parse_dtype_str()?,
                    _ => {
                        return Err(self.err_at(
                            t,
                            format!("expected a shape tuple or a dtype string in R.Tensor(...), found {}", self.describe(t)),
                        ));
                    }
                }
                positional += 1;
            }
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        let close = self.expect(Tk::RParen, "after the R.Tensor arguments")?;
        if let (Some(d), Some(n)) = (&dims, ndim)
            && d.len() != n
        {
            return Err(self.err_at(
                close,
                format!("R.Tensor shape has {} dims but ndim={n}", d.len()),
            ));
        }
        let ndim = dims.as_ref().map(Vec::len).or(ndim);
        Ok(Type::Tensor(TensorType {
            dims: dims.map(Into::into),
            ndim,
            dtype,
        }))
    }

    // ----- dims -----

    /// `(d, ...)` or `[d, ...]`, where each `d` is a dim expression or a dim string.
    fn parse_dim_list(&mut self) -> Result<Vec<Dim>> {
        let open = self.peek();
        let close = match open.kind {
            Tk::LParen => Tk::RParen,
            Tk::LBracket => Tk::RBracket,
            _ => {
                return Err(self.err_at(
                    open,
                    format!(
                        "expected a shape `(...)` or `[...]`, found {}",
                        self.describe(open)
                    ),
                ));
            }
        };
        self.enter(open)?;
        self.bump();
        let mut dims = Vec::new();
        while self.peek().kind != close {
            dims.push(self.parse_dim_top()?);
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        let r = self.expect(close, "after the shape dims");
        self.leave();
        r?;
        Ok(dims)
    }

    /// A dim list of a type: like [`Self::parse_dim_list`], but a static dim must not be
    /// negative.
    fn parse_type_dims(&mut self) -> Result<Vec<Dim>> {
        let at = self.peek();
        let dims = self.parse_dim_list()?;
        if let Some(v) = dims.iter().find_map(|d| d.as_static().filter(|v| *v < 0)) {
            return Err(self.err_at(
                at,
                format!("expected non-negative dims in a type, found {v}"),
            ));
        }
        Ok(dims)
    }

    fn parse_dim_top(&mut self) -> Result<Dim> {
        let t = self.peek();
        self.dim_ops = 0;
        if t.kind == Tk::Str {
            self.bump();
            return self.parse_dim_string(t);
        }
        self.parse_dim_expr()
    }

    fn parse_dim_string(&mut self, t: Token) -> Result<Dim> {
        let raw = self.text(t);
        if raw.contains('\\') {
            return Err(self.err_at(t, "escape sequences are not allowed in a dimension string"));
        }
        let start = t.start as usize + 1;
        let end = (t.end as usize).saturating_sub(1).max(start);
        let sub = lex(self.src, start, end, true).map_err(|(o, m)| self.err_off(o, m))?;
        let saved_toks = std::mem::replace(&mut self.toks, sub);
        let saved_i = std::mem::replace(&mut self.i, 0);
        let r = (|| {
            let d = self.parse_dim_expr()?;
            let e = self.peek();
            if e.kind != Tk::Eof {
                return Err(self.err_at(
                    e,
                    format!(
                        "expected the end of the dimension expression, found {}",
                        self.describe(e)
                    ),
                ));
            }
            Ok(d)
        })();
        self.toks = saved_toks;
        self.i = saved_i;
        r
    }

    fn dim_binary(&mut self, op: DimOp, a: Dim, b: Dim, at: Token) -> Result<Dim> {
        self.dim_ops += 1;
        if self.dim_ops > MAX_DIM_OPS {
            return Err(self.err_at(
                at,
                format!("dimension expression is too long (more than {MAX_DIM_OPS} operators)"),
            ));
        }
        let d = Dim::binary(op, a, b);
        if !dim_in_range(&d) {
            return Err(self.err_at(
                at,
                format!("dimension value is too large (limit {MAX_DIM_CONST})"),
            ));
        }
        Ok(d)
    }

    fn parse_dim_expr(&mut self) -> Result<Dim> {
        let t = self.peek();
        self.enter(t)?;
        let r = (|| {
            let mut a = self.parse_dim_term()?;
            loop {
                let op = match self.peek().kind {
                    Tk::Plus => DimOp::Add,
                    Tk::Minus => DimOp::Sub,
                    _ => break,
                };
                let ot = self.bump();
                let b = self.parse_dim_term()?;
                a = self.dim_binary(op, a, b, ot)?;
            }
            Ok(a)
        })();
        self.leave();
        r
    }

    fn parse_dim_term(&mut self) -> Result<Dim> {
        let mut a = self.parse_dim_factor()?;
        loop {
            let op = match self.peek().kind {
                Tk::Star => DimOp::Mul,
                Tk::SlashSlash => DimOp::FloorDiv,
                Tk::Percent => DimOp::FloorMod,
                _ => break,
            };
            let ot = self.bump();
            let b = self.parse_dim_factor()?;
            a = self.dim_binary(op, a, b, ot)?;
        }
        Ok(a)
    }

    fn parse_dim_factor(&mut self) -> Result<Dim> {
        let t = self.peek();
        match t.kind {
            Tk::Int => {
                self.bump();
                let v: i64 = self
                    .text(t)
                    .parse()
                    .ok()
                    .filter(|v| *v <= MAX_DIM_CONST)
                    .ok_or_else(|| {
                        self.err_at(t, format!("dimension `{}` is too large", self.text(t)))
                    })?;
                Ok(Dim::Static(v))
            }
            Tk::Minus => {
                self.bump();
                let f = self.parse_dim_factor()?;
                self.dim_binary(DimOp::Sub, Dim::Static(0), f, t)
            }
            Tk::LParen => {
                self.bump();
                let d = self.parse_dim_expr()?;
                self.expect(Tk::RParen, "after the dimension expression")?;
                Ok(d)
            }
            Tk::Ident if self.is_ident(t, "T") && self.peek_at(1).kind == Tk::Dot => {
                let (lit, _) = self.parse_t_literal()?;
                match lit {
                    AttrLit::Int(v) if (-MAX_DIM_CONST..=MAX_DIM_CONST).contains(&v) => {
                        Ok(Dim::Static(v))
                    }
                    _ => Err(self.err_at(t, "expected an integer dimension")),
                }
            }
            Tk::Ident => {
                self.bump();
                let name = self.text(t);
                if let Some(s) = self.syms.visible.get(name).cloned() {
                    self.syms.use_sym(&s);
                    return Ok(Dim::Sym(s));
                }
                if self.syms.defining && !is_reserved(name) {
                    let s = Sym::new(name);
                    self.syms.visible.insert(name.to_string(), s.clone());
                    self.syms.use_sym(&s);
                    return Ok(Dim::Sym(s));
                }
                Err(self.err_at(
                    t,
                    format!(
                        "undefined symbolic variable `{name}` (define it with `{name} = T.int64()` or as a string dim in the signature)"
                    ),
                ))
            }
            _ => Err(self.err_at(
                t,
                format!(
                    "expected a dimension (integer, symbol or expression), found {}",
                    self.describe(t)
                ),
            )),
        }
    }
}
