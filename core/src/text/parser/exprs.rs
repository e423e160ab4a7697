//! The parser's expressions: variables, calls of ops, globals and local functions, tuples,
//! metadata constants and `R.*` value forms (`parser.rs` split along that seam; statements and
//! the module level stay there, literals and types are in `types.rs`). Same contract as the
//! parser: every error is positioned, nothing user-written can panic or recurse without bound.

use super::*;

impl<'a> Parser<'a> {
    // ----- expressions -----

    pub(super) fn parse_expr(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let t = self.peek();
        self.enter(t)?;
        let r = self.parse_expr_inner(ctx);
        self.leave();
        r
    }

    pub(super) fn parse_arg(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
        let e = self.parse_expr(ctx)?;
        self.leafify(ctx, e)
    }

    pub(super) fn parse_expr_inner(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
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

    pub(super) fn parse_primary(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
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
                if matches!(name, "True" | "False") && !ctx.scope.contains_key(name) {
                    self.bump();
                    let b = PrimValue::Bool(name == "True");
                    return self.add_expr(ctx, ExprKind::Prim(b), t);
                }
                if name == "None" {
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
                        AttrLit::Int(i) if dt == DType::Bool => PrimValue::Bool(i != 0),
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

    pub(super) fn lookup_var(&self, ctx: &FnCtx<'a>, t: Token) -> Result<VarId> {
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

    pub(super) fn parse_call_args(
        &mut self,
        ctx: &mut FnCtx<'a>,
        what: &str,
    ) -> Result<Vec<ExprId>> {
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

    pub(super) fn parse_local_call(
        &mut self,
        ctx: &mut FnCtx<'a>,
        v: VarId,
        t: Token,
    ) -> Result<ExprId> {
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

    pub(super) fn parse_global_call(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
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

    pub(super) fn parse_metadata(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
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
        // A constant no side file holds is kept without its value.
        if c.is_none()
            && let Some(index) = idx.and_then(|i| u32::try_from(i).ok())
        {
            let r = crate::ir::ConstRef {
                ns: ns.as_str().into(),
                index,
            };
            return self.add_expr(ctx, ExprKind::ConstRef(r), t);
        }
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
                    crate::text::lexer::quote(&ns),
                    self.text(it)
                ),
            ));
        };
        self.add_expr(ctx, ExprKind::Const(c), t)
    }

    /// `R.<path>(...)`: special forms and op calls.
    pub(super) fn parse_r_expr(&mut self, ctx: &mut FnCtx<'a>) -> Result<ExprId> {
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
                        AttrLit::Int(i) if dt == DType::Bool => PrimValue::Bool(i != 0),
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
            "match_cast" => {
                // Only as a binding's whole value (see `parse_binding`).
                if self.cast.is_some() || self.value_start != Some(t.start) {
                    return Err(self.err_at(t, "R.match_cast must be the whole value of a binding"));
                }
                self.expect(Tk::LParen, "after `R.match_cast`")?;
                let v = self.parse_arg(ctx)?;
                self.expect(Tk::Comma, "after the value of `R.match_cast`")?;
                let ty = self.parse_type()?;
                self.expect(Tk::RParen, "after the type of `R.match_cast`")?;
                self.cast = Some(ty);
                Ok(v)
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

    pub(super) fn parse_op_call(
        &mut self,
        ctx: &mut FnCtx<'a>,
        t: Token,
        path: &str,
    ) -> Result<ExprId> {
        let name = format!("relax.{path}");
        let Some(sig) = Op::signature(&name) else {
            return self.parse_opaque_call(ctx, t, path, name);
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

    /// A call of an op outside the op set: every positional argument is an expression, every
    /// keyword a literal, kept as written; the type is the binding's annotation, so the call
    /// must be the whole value of an annotated binding.
    fn parse_opaque_call(
        &mut self,
        ctx: &mut FnCtx<'a>,
        t: Token,
        path: &str,
        name: String,
    ) -> Result<ExprId> {
        let ty = match self.value_ann.take() {
            Some((start, ty)) if start == t.start => ty,
            other => {
                self.value_ann = other;
                return Err(self.err_at(
                    t,
                    format!(
                        "unknown op `{name}`: a call of an op outside the op set takes its type from the binding's annotation; write it as the whole value of an annotated binding, `name: <type> = R.{path}(...)`"
                    ),
                ));
            }
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
        let mut attrs: Vec<(Box<str>, AttrLit)> = Vec::new();
        while self.peek().kind != Tk::RParen {
            let at = self.peek();
            if at.kind == Tk::Ident && self.peek_at(1).kind == Tk::Eq {
                let key = self.text(at);
                self.i += 2;
                let lit = self.parse_literal()?;
                if attrs.iter().any(|(k, _)| &**k == key) {
                    return Err(
                        self.err_at(at, format!("attribute `{key}` of `{name}` is given twice"))
                    );
                }
                attrs.push((key.into(), lit));
            } else {
                if !attrs.is_empty() {
                    return Err(self.err_at(at, "positional argument after keyword arguments"));
                }
                args.push(self.parse_arg(ctx)?);
            }
            if self.peek().kind == Tk::Comma {
                self.bump();
            } else {
                break;
            }
        }
        self.expect(Tk::RParen, "after the op arguments")?;
        let op = Op::Opaque(Box::new(crate::op::OpaqueOp {
            name: name.into(),
            attrs,
            ty,
        }));
        self.add_expr(
            ctx,
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            },
            t,
        )
    }

    pub(super) fn parse_const(&mut self, ctx: &mut FnCtx<'a>, t: Token) -> Result<ExprId> {
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
}
