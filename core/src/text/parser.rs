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

mod control_flow;
mod exprs;
mod types;

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

/// The binding that ends a branch of an `if`: the result's name, where it is written, and its
/// annotation (when one is written).
struct BranchResult {
    name: String,
    tok: Token,
    ann: Option<Type>,
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
    /// The name token of the last binding read, and whether it had an annotation (an `if`
    /// branch's result is its last binding).
    last_name_tok: Option<Token>,
    last_annotated: bool,
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
    /// The annotation of the binding being read, with the byte offset where its value starts:
    /// the type of a call of an op outside the op set written there (see [`crate::op::OpaqueOp`]).
    value_ann: Option<(u32, Type)>,
    /// The type of the `R.match_cast(value, type)` just parsed as a binding's value (the
    /// value itself is the bound expression: the binding is the cast).
    cast: Option<Type>,
    /// Where the value of the binding being read starts (`R.match_cast` must start there).
    value_start: Option<u32>,
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
        ExprKind::Call { .. }
            | ExprKind::TupleGetItem(..)
            | ExprKind::Function(_)
            | ExprKind::If(_)
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
            value_ann: None,
            cast: None,
            value_start: None,
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
            last_name_tok: None,
            last_annotated: false,
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
                            // The declared return type must accept the value as inferred
                            // (the verifier's rule): a refinement needs an annotated binding
                            // (`R.match_cast`) before the `return`.
                            if !ann.accepts(&inferred) {
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
            Tk::Ident if self.text(t) == "if" => self.parse_if(ctx),
            Tk::Ident if self.text(t) == "else" => Err(self.err_at(t, "`else` without an `if`")),
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
                AttrLit::None | AttrLit::List(_) | AttrLit::IndexMap(_) => {
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
        // Symbols of the nested function's signature are used by the outer one as well (the
        // var bound to it has that type), in order of first use.
        let mut sig_syms: Vec<Sym> = Vec::new();
        Type::Func(f.func_type()).for_each_sym(&mut |s| {
            if !sig_syms.contains(s) {
                sig_syms.push(s.clone());
            }
        });
        for s in &sig_syms {
            self.syms.use_sym(s);
        }
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
        ctx.last_name_tok = Some(name_tok);
        ctx.last_annotated = ann.is_some();
        self.expect(Tk::Eq, "after the binding's variable")?;
        if ctx.scope.contains_key(name) {
            return Err(self.err_at(name_tok, format!("duplicate definition of `{name}`")));
        }
        let first = self.peek();
        self.value_ann = ann.as_ref().map(|(ty, _)| (first.start, ty.clone()));
        self.cast = None;
        self.value_start = Some(first.start);
        let e = self.parse_expr(ctx);
        self.value_start = None;
        self.value_ann = None;
        let mut e = e?;
        // A bare tuple, as TVM prints one bound to a var: `gv: R.Tuple(...) = lv4, lv9`.
        // Its fields are leaves, as in a parenthesised tuple: a nested call gets a binding.
        if self.peek().kind == Tk::Comma && self.cast.is_some() {
            return Err(self.err_at(first, "R.match_cast must be the whole value of a binding"));
        }
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
        let mut inferred = ctx.f.expr(e).ty.clone();
        if let Some(cast) = self.cast.take() {
            // `R.match_cast(v, T)`: the binding's type is `T`, a refinement of `v`'s (the
            // executor checks the rest when the value arrives); an annotation must say `T`.
            if !inferred.accepts(&cast) {
                return Err(self.err_at(
                    first,
                    format!(
                        "R.match_cast to {}, which does not refine the value's type {} (only \
                         refinements are supported)",
                        brief(&cast),
                        brief(&inferred)
                    ),
                ));
            }
            if let Some((a, at)) = &ann
                && *a != cast
            {
                return Err(self.err_at(
                    *at,
                    format!(
                        "type mismatch: annotation says {} but R.match_cast gives {}",
                        brief(a),
                        brief(&cast)
                    ),
                ));
            }
            inferred = cast;
        }
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
        if matches!(
            ctx.f.exprs.get(e).map(|d| &d.kind),
            Some(ExprKind::ConstRef(_))
        ) {
            ctx.f.exprs[e].ty = ty.clone();
        }
        Self::type_valueless_args(ctx, e, &ty);
        let v = ctx.f.add_var(name, ty, ctx.in_dataflow);
        Self::emit(ctx, v, e);
        ctx.scope.insert(Cow::Borrowed(name), (v, true));
        Ok(())
    }

    /// Types the constants without values among the arguments of op call `e` from their use
    /// (see [`crate::ir::infer::valueless_from_use`]), given the binding's type `out`, and
    /// infers the call's type again from theirs.
    fn type_valueless_args(ctx: &mut FnCtx<'a>, e: ExprId, out: &Type) {
        let Some(ExprKind::Call {
            callee: Callee::Op(op),
            args,
        }) = ctx.f.exprs.get(e).map(|d| &d.kind)
        else {
            return;
        };
        let unknown = Type::Tensor(crate::ir::TensorType {
            dims: None,
            ndim: None,
            dtype: None,
        });
        let mut refined = Vec::new();
        for (i, &a) in args.iter().enumerate() {
            let d = ctx.f.expr(a);
            if !matches!(d.kind, ExprKind::ConstRef(_)) || d.ty != unknown {
                continue;
            }
            let tys: Vec<&Type> = args.iter().map(|&x| &ctx.f.expr(x).ty).collect();
            if let Some(t) = crate::ir::infer::valueless_from_use(op, &tys, i, out) {
                refined.push((a, Type::Tensor(t)));
            }
        }
        if refined.is_empty() {
            return;
        }
        let (op, args) = (op.clone(), args.clone());
        let before: Vec<(ExprId, Type)> = refined
            .iter()
            .map(|&(a, _)| (a, ctx.f.expr(a).ty.clone()))
            .collect();
        for (a, t) in refined {
            ctx.f.exprs[a].ty = ctx.shapes.intern(t);
        }
        let tys: Vec<&Type> = args.iter().map(|&x| &ctx.f.expr(x).ty).collect();
        match op.infer(&tys) {
            Ok(t) if t.accepts(out) => {
                let t = ctx.shapes.intern(t);
                ctx.f.exprs[e].ty = t;
            }
            // The refinement contradicts the call: keep what the text said.
            _ => {
                for (a, t) in before {
                    ctx.f.exprs[a].ty = t;
                }
            }
        }
    }

    /// Whether annotation `ann` may be given to a value of inferred type `inferred`. Calls of
    /// functions whose types mention the callee's own symbolic dims are not checked (the
    /// inference does not substitute them).
    fn compatible(&self, ann: &Type, inferred: &Type, f: &Function, e: ExprId) -> bool {
        if ann.accepts(inferred) {
            return true;
        }
        // An annotation may refine a less specific inferred type (a constant without a value,
        // a call reading one, or a parameter of unknown rank), as TVM's parser allows: it
        // refuses only annotations its StructInfoBaseCheck fails at level 0. The executor
        // checks every value against its var's type.
        if inferred.accepts(ann) {
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
}
