//! The parser's literals, type annotations and symbolic dims: `parser.rs` split along that
//! seam (the statements and expressions stay there). Same contract as the parser: every
//! error is positioned, nothing user-written can panic or recurse without bound.

use super::*;

impl<'a> Parser<'a> {
    // ----- literals -----

    /// `T.int64(3)`, `T.float32(0.5)`: returns the value and the dtype.
    pub(super) fn parse_t_literal(&mut self) -> Result<(AttrLit, DType)> {
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

    /// `lambda a, b: (a, b // 16, b % 16)`, up to the `,` or `)` that closes it: the index map
    /// of `R.layout_transform` ([`crate::op::IndexMap`]).
    fn parse_index_map(&mut self) -> Result<AttrLit> {
        let first = self.peek();
        let mut depth = 0usize;
        let mut body = false;
        let mut last = first;
        loop {
            let t = self.peek();
            match t.kind {
                Tk::LParen | Tk::LBracket => depth += 1,
                Tk::RParen | Tk::RBracket if depth == 0 => break,
                Tk::RParen | Tk::RBracket => depth -= 1,
                Tk::Colon if depth == 0 => body = true,
                Tk::Comma if depth == 0 && body => break,
                Tk::Eof | Tk::Newline | Tk::Indent | Tk::Dedent => break,
                _ => {}
            }
            last = t;
            self.bump();
        }
        let text = self
            .src
            .get(first.start as usize..last.end as usize)
            .unwrap_or("");
        crate::op::IndexMap::parse(text)
            .map(AttrLit::IndexMap)
            .map_err(|e| self.err_at(first, format!("invalid index map: {e}")))
    }

    pub(super) fn parse_literal(&mut self) -> Result<AttrLit> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_literal_inner();
        self.leave();
        r
    }

    pub(super) fn parse_number(&mut self, neg: bool) -> Result<AttrLit> {
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

    pub(super) fn parse_literal_inner(&mut self) -> Result<AttrLit> {
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
                "T" if self.peek_at(1).kind == Tk::Dot
                    && self.is_ident(self.peek_at(2), "index_map") =>
                {
                    self.i += 3;
                    self.expect(Tk::LParen, "after `T.index_map`")?;
                    let m = self.parse_index_map()?;
                    self.expect(Tk::RParen, "after the index map's lambda")?;
                    Ok(m)
                }
                "lambda" => self.parse_index_map(),
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

    pub(super) fn parse_type(&mut self) -> Result<Type> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_type_inner();
        self.leave();
        r
    }

    pub(super) fn type_error(&self, t: Token) -> Error {
        self.err_at(
            t,
            format!(
                "expected R.Tensor(...) type annotation (or R.Tuple, R.Shape, R.Prim, T.<dtype>, R.Object, R.Callable), found {}",
                self.describe(t)
            ),
        )
    }

    pub(super) fn parse_type_inner(&mut self) -> Result<Type> {
        let t = self.peek();
        // `T.bool`, `T.int64`: a prim value's type as TVM prints a parameter's.
        if self.is_ident(t, "T")
            && self.peek_at(1).kind == Tk::Dot
            && self.peek_at(2).kind == Tk::Ident
            && self.peek_at(3).kind != Tk::LParen
        {
            let dt = self.peek_at(2);
            let name = self.text(dt);
            let d = dtype_of(name)
                .ok_or_else(|| self.err_at(dt, format!("unknown dtype `T.{name}`")))?;
            self.i += 3;
            return Ok(Type::Prim(d));
        }
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

    pub(super) fn parse_ndim(&mut self) -> Result<Option<usize>> {
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

    pub(super) fn parse_dtype_str(&mut self) -> Result<Option<DType>> {
        let st = self.expect(Tk::Str, "(a dtype string)")?;
        let s = unescape(self.text(st)).map_err(|(o, m)| self.err_off(st.start as usize + o, m))?;
        if s == "void" || s.is_empty() {
            return Ok(None);
        }
        dtype_of(&s)
            .map(Some)
            .ok_or_else(|| self.err_at(st, format!("unknown dtype \"{s}\"")))
    }

    pub(super) fn parse_tensor_args(&mut self) -> Result<Type> {
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
    pub(super) fn parse_dim_list(&mut self) -> Result<Vec<Dim>> {
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
    pub(super) fn parse_type_dims(&mut self) -> Result<Vec<Dim>> {
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

    pub(super) fn parse_dim_top(&mut self) -> Result<Dim> {
        let t = self.peek();
        self.dim_ops = 0;
        if t.kind == Tk::Str {
            self.bump();
            return self.parse_dim_string(t);
        }
        self.parse_dim_expr()
    }

    pub(super) fn parse_dim_string(&mut self, t: Token) -> Result<Dim> {
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

    pub(super) fn dim_binary(&mut self, op: DimOp, a: Dim, b: Dim, at: Token) -> Result<Dim> {
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

    pub(super) fn parse_dim_expr(&mut self) -> Result<Dim> {
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

    pub(super) fn parse_dim_term(&mut self) -> Result<Dim> {
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

    pub(super) fn parse_dim_factor(&mut self) -> Result<Dim> {
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
            // `T.max(a, b)`, `T.min(a, b)`
            Tk::Ident
                if self.is_ident(t, "T")
                    && self.peek_at(1).kind == Tk::Dot
                    && ["max", "min"]
                        .iter()
                        .any(|f| self.is_ident(self.peek_at(2), f)) =>
            {
                self.bump();
                self.bump();
                let f = self.bump();
                let (op, name) = if self.is_ident(f, "max") {
                    (DimOp::Max, "T.max")
                } else {
                    (DimOp::Min, "T.min")
                };
                self.expect(Tk::LParen, &format!("after `{name}`"))?;
                let a = self.parse_dim_expr()?;
                self.expect(Tk::Comma, &format!("between `{name}`'s two dimensions"))?;
                let b = self.parse_dim_expr()?;
                self.expect(Tk::RParen, &format!("after `{name}`'s two dimensions"))?;
                self.dim_binary(op, a, b, t)
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
