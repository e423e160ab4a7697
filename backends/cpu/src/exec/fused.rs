//! The executor's fused kernels: a composite whose body `composite.rs` recognises, a FuseOps
//! function of elementwise ops (or a `conv2d` and such ops) run as one elementwise program
//! (`elem_program.rs`), and a fusable `conv2d` chain (`fuse.rs`) run as one kernel.
//!
//! Contract: each runner returns `None` when the function has another form or its values do
//! not fit (the bindings are then interpreted one by one, with the same result); otherwise the
//! fused result, checked against the function's return type (`check_fused_result`), with the
//! same bits as the ops run one by one.
//!
//! ```text
//! @R.function(private=True)
//! def fused_conv2d_add_clip(x, w, b):        # one `conv2d` kernel with its epilogue
//!     lv = R.nn.conv2d(x, w)
//!     lv1 = R.add(lv, b)
//!     gv = R.clip(lv1, 0, 6)
//!     return gv
//! ```

use super::*;

impl<'m> Interp<'m> {
    /// `conv2d(x, w)` with the epilogue `steps` through [`conv_kernel`], with the weight
    /// transforms the executor keeps (Winograd, packed columns).
    fn fused_conv(
        &self,
        x: &Tensor,
        w: &Tensor,
        attrs: &fusebox_core::op::Conv2dAttrs,
        steps: &[crate::conv::Step],
    ) -> Result<Tensor> {
        let wino = self.exec.winograd_weights(x, w, attrs);
        let cols = self.exec.cols_weights(x, w, attrs);
        let blocked = self.exec.blocked_weights(x, w, attrs);
        let prep = crate::conv::Prepared {
            wino: wino.as_deref(),
            cols: cols.as_deref(),
            blocked: blocked.as_deref(),
        };
        conv_kernel(x, w, attrs, steps, prep)
    }

    /// Runs a composite whose body `composite.rs` recognises as one fused kernel: `None` when
    /// the body has another form or the values do not fit (the body is then interpreted).
    /// `known` is the body's plan when the caller has it (from the function's facts).
    pub(super) fn run_composite(
        &self,
        name: &str,
        f: &Function,
        args: &[Value],
        known: Option<&crate::composite::Plan>,
    ) -> Result<Option<Value>> {
        let recognised;
        let plan = match known {
            Some(p) => p,
            None => {
                let Some(p) = crate::composite::recognise(f) else {
                    return Ok(None);
                };
                recognised = p;
                &recognised
            }
        };
        let input = |leaf| self.leaf_value(name, f, args, leaf);
        let t = self.profile.as_ref().map(|_| std::time::Instant::now());
        let packed = |x: &Tensor, w: &Tensor| self.exec.packed_weight(x, w);
        let Some(out) = crate::composite::run(plan, &input, &packed).map_err(|e| at(name, e))?
        else {
            return Ok(None);
        };
        self.record_shapes(plan.kernel_name(), args, t);
        check_fused_result(name, f, args, &out, "fused kernel")?;
        Ok(Some(out))
    }

    /// The value of a fused kernel's input: argument `i` (on the host), or a constant of `f`.
    pub(super) fn leaf_value(
        &self,
        name: &str,
        f: &Function,
        args: &[Value],
        leaf: crate::composite::Leaf,
    ) -> Result<Value> {
        match leaf {
            crate::composite::Leaf::Param(i) => args
                .get(i)
                .cloned()
                .ok_or_else(|| Error::Exec(format!("`{name}`: no argument {i}")))?
                .to_host()
                .map_err(Error::from),
            crate::composite::Leaf::Const(e) => match &f.expr(e).kind {
                ExprKind::Const(c) => Ok(Value::Tensor(self.exec.constant(c)?)),
                _ => Err(Error::Exec(format!("`{name}`: expected a constant"))),
            },
        }
    }

    /// Runs a FuseOps function whose bindings are covered elementwise ops, or a `conv2d`
    /// followed by such ops, as one elementwise program (`elem_program.rs`; after a `conv2d`,
    /// the convolution's epilogue): `None` when the function has another form, when
    /// `fuse.rs` fuses it whole already, or when the values do not allow it (the bindings are
    /// then interpreted). The call hook declined this function already (its caller offered it
    /// first), so nothing else runs it.
    pub(super) fn run_elem_group(
        &self,
        name: &str,
        f: &Function,
        args: &[Value],
        facts: Option<&Facts>,
    ) -> Result<Option<Value>> {
        let compiled;
        let Some(group) = (match facts {
            Some(d) => d.group.as_ref(),
            None => {
                compiled = crate::elem_program::compile(f);
                compiled.as_ref()
            }
        }) else {
            return Ok(None);
        };
        // A conv2d chain of `fuse.rs` that covers the whole function keeps running as it did.
        let n = f.bindings().count();
        let planned;
        let chains = match facts {
            Some(d) => &d.chains,
            None => {
                planned = fuse::plan(self.module, f, &|_| false);
                &planned
            }
        };
        if let Some(Some(chain)) = chains.first()
            && matches!(chain.head, fuse::Head::Conv { .. })
            && chain.links.len() + 1 == n
        {
            return Ok(None);
        }
        // A shape (the argument of a view's `broadcast_to` or `reshape`) as an `int64` tensor.
        let leaf = |l| -> Result<Option<Tensor>> {
            Ok(match self.leaf_value(name, f, args, l)? {
                Value::Tensor(t) => Some(t),
                Value::Shape(dims) => Some(Tensor::from_i64(vec![dims.len()], dims)?),
                _ => None,
            })
        };
        let Some(leaves) = group
            .prog
            .leaves
            .iter()
            .map(|&l| leaf(l))
            .collect::<Result<Option<Vec<Tensor>>>>()?
        else {
            return Ok(None);
        };
        let out = match &group.head {
            None => {
                let Some(bound) = crate::elem_program::bind(&group.prog, &leaves, None) else {
                    return Ok(None);
                };
                fusebox_core::runtime::memory::check_alloc(
                    bound.name(),
                    DType::F32,
                    bound.shape(),
                )?;
                let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                let y = bound.run().map_err(|message| Error::Kernel {
                    op: "relax.elementwise",
                    message,
                })?;
                self.record(bound.name(), t);
                y
            }
            Some(crate::elem_program::Head::Matmul { op, lhs, rhs }) => {
                let (Some(a), Some(b)) = (leaf(*lhs)?, leaf(*rhs)?) else {
                    return Ok(None);
                };
                let f32_out = matches!(
                    op,
                    Op::Matmul {
                        out_dtype: None | Some(DType::F32)
                    }
                );
                if !f32_out || a.as_f32().is_none() || b.as_f32().is_none() {
                    return Ok(None);
                }
                let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                // The matmul kernel itself (its result checked against the memory limit).
                let Value::Tensor(y) = self.run_op(op, &[Value::Tensor(a), Value::Tensor(b)])?
                else {
                    return Ok(None);
                };
                let Some(y) = program_over(&group.prog, &leaves, y)? else {
                    return Ok(None);
                };
                self.record(&group.prog.name, t);
                y
            }
            Some(crate::elem_program::Head::Concat { op, parts }) => {
                let Some(parts) = parts
                    .iter()
                    .map(|&p| leaf(p))
                    .collect::<Result<Option<Vec<Tensor>>>>()?
                else {
                    return Ok(None);
                };
                if parts.iter().any(|p| p.as_f32().is_none()) {
                    return Ok(None);
                }
                let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                // The concatenation's kernel (its result checked against the memory limit),
                // then the program in place over its output.
                let vals = [Value::Tuple(parts.into_iter().map(Value::Tensor).collect())];
                fusebox_core::runtime::memory::check_op_result(op, &vals)?;
                let Value::Tensor(y) = self.run_op(op, &vals)? else {
                    return Ok(None);
                };
                let Some(y) = program_over(&group.prog, &leaves, y)? else {
                    return Ok(None);
                };
                self.record(&group.prog.name, t);
                y
            }
            Some(crate::elem_program::Head::Conv {
                data,
                weight,
                attrs,
            }) => {
                let (Some(x), Some(w)) = (leaf(*data)?, leaf(*weight)?) else {
                    return Ok(None);
                };
                // A convolution in a split layout (`NCHW16c`, `NCHW8c`) runs its blocked
                // kernel, whose epilogue takes no program: the program then makes one pass
                // over its output (MobileNetV3's hardswish after each convolution, which ran
                // op by op before).
                let blocked = crate::conv::runs_blocked(&x, &w, attrs);
                if !blocked && !crate::conv::fusable(&x, &w, attrs) {
                    return Ok(None);
                }
                let Ok((shape, _)) = crate::conv::out_dims(&x, &w, attrs) else {
                    return Ok(None);
                };
                let bound = crate::elem_program::bind(&group.prog, &leaves, Some(&shape));
                if bound.is_none() && !crate::elem_program::fits_after(&group.prog, &leaves, &shape)
                {
                    return Ok(None);
                }
                let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                let kernel = |message| Error::Kernel {
                    op: "relax.nn.conv2d",
                    message,
                };
                // A program that is a chain of the convolution's own steps (a bias, then
                // SiLU) runs as them: in registers where the kernel takes them (a split
                // layout's kernels take no others). Otherwise the epilogue runs per output
                // row of one channel: on small planes, a call per row costs more than one
                // in-place pass over the (cached) output. A result larger than the
                // convolution's output is a pass of its own.
                let steps = bound
                    .as_ref()
                    .and_then(|b| b.conv_steps())
                    .filter(|s| !blocked || crate::conv::blocked_steps(s));
                let y = match (bound, steps) {
                    (_, Some(steps)) => self.fused_conv(&x, &w, attrs, &steps)?,
                    (None, None) => {
                        let y = self.fused_conv(&x, &w, attrs, &[])?;
                        run_after(&group.prog, &leaves, y)?.ok_or_else(|| {
                            kernel("the program does not fit its inputs".to_string())
                        })?
                    }
                    (Some(bound), None)
                        if !blocked
                            && shape[2] * shape[3] >= crate::elem_program::EPILOGUE_MIN_ROW =>
                    {
                        let step = crate::conv::Step::Program(crate::elem_program::ProgramStep(
                            Arc::new(bound),
                        ));
                        self.fused_conv(&x, &w, attrs, &[step])?
                    }
                    (Some(bound), None) => {
                        let y = self.fused_conv(&x, &w, attrs, &[])?;
                        let n = y.numel();
                        let mut data = match y.try_into_buffer() {
                            Ok(fusebox_core::runtime::Storage::F32(v)) => v,
                            _ => {
                                return Err(kernel(
                                    "the convolution's output is shared".to_string(),
                                ));
                            }
                        };
                        bound.apply_all(&mut data[..n]);
                        Tensor::from_prefix(
                            shape.to_vec(),
                            fusebox_core::runtime::Storage::F32(data),
                        )?
                    }
                };
                self.record_conv(&group.prog.name, &x, &w, t);
                y
            }
        };
        let out = Value::Tensor(out);
        check_fused_result(name, f, args, &out, "fused elementwise kernel")?;
        Ok(Some(out))
    }

    /// Runs a fusable chain as one kernel: `None` when its values do not allow it (the
    /// bindings then run one by one).
    pub(super) fn run_chain<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        chain: &fuse::Chain,
        depth: usize,
    ) -> Result<Option<Value>> {
        self.chain_kernel(chain, &mut |e| self.eval(name, f, fr, e, depth))
    }

    /// Runs `f`, whose bindings are the one chain of `whole`, straight from its arguments:
    /// `None` when an argument is not a host tensor of its parameter's type or the values do
    /// not allow the fused kernel (then [`Interp::call`] interprets `f`, reporting what
    /// does not fit). A result that does not fit the return type is reported by
    /// [`check_fused_result`], as the other fused kernels' are.
    pub(super) fn run_whole(
        &self,
        name: &str,
        f: &Function,
        whole: &Whole,
        args: &[Value],
        site: Option<&Site>,
    ) -> Result<Option<Value>> {
        // The symbols' extents (a model has one or two: `batch`, `sequence`).
        let mut bound = [None; 4];
        let Some(bound) = bound.get_mut(..whole.syms) else {
            return Ok(None);
        };
        if args.len() != whole.params.len()
            || !whole
                .params
                .iter()
                .zip(args)
                .all(|(t, a)| t.holds(a, bound))
        {
            return Ok(None);
        }
        let mut value = |e: ExprId| -> Result<Value> {
            match &f.expr(e).kind {
                ExprKind::Var(v) => f
                    .params
                    .iter()
                    .position(|p| p == v)
                    .and_then(|i| args.get(i).cloned())
                    .ok_or_else(|| Error::Exec(format!("`{name}`: var {v} is not a parameter"))),
                ExprKind::Const(c) => Ok(Value::Tensor(self.exec.constant(c)?)),
                _ => Err(Error::Exec(format!(
                    "`{name}`: expected a parameter or a constant"
                ))),
            }
        };
        let ready = match site {
            Some(site) => site
                .ready
                .get_or_init(|| self.ready(f, whole, site, args, &mut value))
                .as_ref(),
            None => None,
        };
        let out = match ready.zip(ready_data(f, whole, args)) {
            Some((r, x)) if r.x_shape == x.shape() => {
                let fuse::Head::Conv { attrs, .. } = &whole.chain.head else {
                    return Ok(None);
                };
                let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                let prep = crate::conv::Prepared {
                    wino: r.wino.as_deref(),
                    cols: r.cols.as_deref(),
                    blocked: r.blocked.as_deref(),
                };
                let y = conv_kernel(x, &r.w, attrs, &r.steps, prep)
                    .map_err(|e| at(&binding_ctx(name, f.var(whole.first)), e))?;
                self.record_chain(&whole.chain, x, &r.w, t);
                Value::Tensor(y)
            }
            _ => {
                let Some(out) = self
                    .chain_kernel(&whole.chain, &mut value)
                    .map_err(|e| at(&binding_ctx(name, f.var(whole.first)), e))?
                else {
                    return Ok(None);
                };
                out
            }
        };
        if !whole.ret.holds(&out, bound) {
            // Reported as the other fused kernels' results are.
            check_fused_result(name, f, args, &out, "fused kernel")?;
        }
        Ok(Some(out))
    }

    /// The [`Ready`] of a call of `f` (one chain, `whole`) at `site` with `args`: `None` when
    /// the chain does not read its data from a parameter, reads a parameter other than its
    /// data that is not a constant at the site (a residual), ends in a `batch_norm` (whose
    /// result carries its operands), or the values do not allow the fused kernel.
    fn ready(
        &self,
        f: &Function,
        whole: &Whole,
        site: &Site,
        args: &[Value],
        value: &mut dyn FnMut(ExprId) -> Result<Value>,
    ) -> Option<Ready> {
        let fuse::Head::Conv { weight, attrs, .. } = &whole.chain.head else {
            return None;
        };
        if matches!(whole.chain.links.last(), Some(fuse::Link::BatchNorm { .. })) {
            return None;
        }
        let x = ready_data(f, whole, args)?;
        // Each of the others a constant of the function or one at the site.
        let exprs: Vec<ExprId> = std::iter::once(*weight)
            .chain(fuse::operand_exprs(&whole.chain))
            .collect();
        let fixed = exprs.iter().all(|&e| match &f.expr(e).kind {
            ExprKind::Const(_) => true,
            ExprKind::Var(v) => f
                .params
                .iter()
                .position(|p| p == v)
                .is_some_and(|i| site.consts.get(i).is_some_and(Option::is_some)),
            _ => false,
        });
        if !fixed {
            return None;
        }
        let Ok(Value::Tensor(w)) = value(*weight) else {
            return None;
        };
        let operands = exprs[1..]
            .iter()
            .map(|&e| value(e))
            .collect::<Result<Vec<_>>>()
            .ok()?;
        let steps = fuse::steps(&whole.chain, x, &w, &operands)?;
        Some(Ready {
            x_shape: x.shape().to_vec(),
            wino: self.exec.winograd_weights(x, &w, attrs),
            cols: self.exec.cols_weights(x, &w, attrs),
            blocked: self.exec.blocked_weights(x, &w, attrs),
            w,
            steps,
        })
    }

    /// The fused kernel of `chain`, its inputs given by `value`: `None` when the values do
    /// not allow it.
    fn chain_kernel(
        &self,
        chain: &fuse::Chain,
        value: &mut dyn FnMut(ExprId) -> Result<Value>,
    ) -> Result<Option<Value>> {
        let tensor = |v: Value| match v {
            Value::Tensor(t) => Some(t),
            _ => None,
        };
        let (a, b) = match &chain.head {
            fuse::Head::Conv { data, weight, .. } => (*data, *weight),
            fuse::Head::Add { lhs, rhs } => (*lhs, *rhs),
        };
        let Some(x) = tensor(value(a)?) else {
            return Ok(None);
        };
        let Some(w) = tensor(value(b)?) else {
            return Ok(None);
        };
        if let fuse::Head::Add { .. } = chain.head {
            fusebox_core::runtime::memory::check_op_result(
                &Op::Add,
                &[Value::Tensor(x.clone()), Value::Tensor(w.clone())],
            )?;
            let t = self.profile.as_ref().map(|_| std::time::Instant::now());
            let out = crate::elementwise::add_relu_f32(&x, &w).map(Value::Tensor);
            self.record_chain(chain, &x, &w, t);
            return Ok(out);
        }
        let operands = fuse::operand_exprs(chain)
            .into_iter()
            .map(&mut *value)
            .collect::<Result<Vec<_>>>()?;
        let Some(steps) = fuse::steps(chain, &x, &w, &operands) else {
            return Ok(None);
        };
        let fuse::Head::Conv { attrs, .. } = &chain.head else {
            return Ok(None);
        };
        let t = self.profile.as_ref().map(|_| std::time::Instant::now());
        let y = self.fused_conv(&x, &w, attrs, &steps)?;
        let out = fuse::result(chain, y, &operands);
        self.record_chain(chain, &x, &w, t);
        Ok(out)
    }

    /// [`Self::record_conv`] under `chain`'s name, made only when profiling (not per call).
    fn record_chain(
        &self,
        chain: &fuse::Chain,
        x: &Tensor,
        w: &Tensor,
        t: Option<std::time::Instant>,
    ) {
        if t.is_some() {
            self.record_conv(&fuse::name(chain), x, w, t);
        }
    }

    /// When profiling (`t` is the start), the time since `t` to the profile entry `name` of a
    /// convolution chain or program on operands of the shapes of `x` and `w`.
    fn record_conv(&self, name: &str, x: &Tensor, w: &Tensor, t: Option<std::time::Instant>) {
        if t.is_some() {
            let vals = [Value::Tensor(x.clone()), Value::Tensor(w.clone())];
            self.record_shapes(name, &vals, t);
        }
    }
}

/// [`crate::conv::conv2d_fused`] with the weight forms `prep`: the result's size checked
/// against the memory limit first, from the shapes alone (a geometry the kernel rejects is
/// its error to report), a kernel error named as `relax.nn.conv2d`'s.
fn conv_kernel(
    x: &Tensor,
    w: &Tensor,
    attrs: &fusebox_core::op::Conv2dAttrs,
    steps: &[crate::conv::Step],
    prep: crate::conv::Prepared<'_>,
) -> Result<Tensor> {
    if let Ok((shape, _)) = crate::conv::out_dims(x, w, attrs) {
        fusebox_core::runtime::memory::check_alloc("relax.nn.conv2d", DType::F32, &shape)?;
    }
    crate::conv::conv2d_fused(x, w, attrs, steps, prep).map_err(|message| Error::Kernel {
        op: "relax.nn.conv2d",
        message,
    })
}

/// The data tensor of a call of `f` (one chain, `whole`): the argument the convolution reads
/// as its data, when that is a parameter.
fn ready_data<'a>(f: &Function, whole: &Whole, args: &'a [Value]) -> Option<&'a Tensor> {
    let fuse::Head::Conv { data, .. } = &whole.chain.head else {
        return None;
    };
    let ExprKind::Var(v) = &f.expr(*data).kind else {
        return None;
    };
    match args.get(f.params.iter().position(|p| p == v)?)? {
        Value::Tensor(t) => Some(t),
        _ => None,
    }
}

/// Checks the arguments of `f` against its parameters (binding its symbols) and then the
/// result `out` of a fused `kernel` that replaced its body against its return type.
pub(super) fn check_fused_result(
    name: &str,
    f: &Function,
    args: &[Value],
    out: &Value,
    kernel: &str,
) -> Result<()> {
    let mut syms = BTreeMap::new();
    for bind in [true, false] {
        for (&p, a) in f.params.iter().zip(args) {
            match_type(&f.var(p).ty, a, &mut syms, bind)
                .map_err(|m| Error::Exec(format!("`{name}`: argument: {m}")))?;
        }
    }
    match_type(&f.ret_ty, out, &mut syms, false).map_err(|m| {
        Error::Exec(format!(
            "`{name}`: the {kernel}'s result does not match the return type: {m}"
        ))
    })
}

/// `prog` over `y`, the output of its head's kernel (a `matmul`, a `concat`): in place when
/// the result has `y`'s shape and `y` is not shared, else (a result that outgrows it, or a
/// shared output) a pass of its own reading it; `None` when the values do not fit.
fn program_over(
    prog: &crate::elem_program::Program,
    leaves: &[Tensor],
    y: Tensor,
) -> Result<Option<Tensor>> {
    let shape = y.shape().to_vec();
    let bound = crate::elem_program::bind(prog, leaves, Some(&shape));
    // The whole buffer, so that a kept buffer's slack stays with it (see
    // `crate::par::Scratch`); the result is its first `n` elements.
    let n = y.numel();
    match (bound, y.try_into_buffer()) {
        (Some(bound), Ok(fusebox_core::runtime::Storage::F32(mut data))) => {
            bound.apply_all(&mut data[..n]);
            Ok(Some(Tensor::from_prefix(
                shape,
                fusebox_core::runtime::Storage::F32(data),
            )?))
        }
        (_, Ok(storage)) => run_after(prog, leaves, Tensor::from_prefix(shape, storage)?),
        (_, Err(y)) => run_after(prog, leaves, y),
    }
}

/// Runs `prog` after its head, whose output `head` it reads as an input (see
/// `elem_program::bind_after`): `None` when the values do not fit it.
pub(super) fn run_after(
    prog: &crate::elem_program::Program,
    leaves: &[Tensor],
    head: Tensor,
) -> Result<Option<Tensor>> {
    let Some(after) = crate::elem_program::bind_after(prog, leaves, head) else {
        return Ok(None);
    };
    fusebox_core::runtime::memory::check_alloc(after.name(), DType::F32, after.shape())?;
    let y = after.run().map_err(|message| Error::Kernel {
        op: "relax.elementwise",
        message,
    })?;
    Ok(Some(y))
}
