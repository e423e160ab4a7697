//! The CUDA C++ emitter: one `extern "C" __global__` function per [`Kernel`].
//!
//! Contract:
//!
//! - [`emit`] prints a self-contained translation unit (only `cuda_fp16.h` / `cuda_bf16.h` are
//!   included, and only when a buffer or conversion needs them) that NVRTC compiles. Parameters:
//!   every input buffer (`const T* __restrict__`), then every output buffer, in order.
//! - Every DAG node becomes one `const` local, emitted once in the outermost scope where its
//!   operands are defined: values that do not depend on the innermost coordinate are hoisted out
//!   of the per-element loop, values that do not depend on a reduction variable out of its loop.
//! - Map kernels: a grid-stride loop over the space, `vector` elements per step; loads that walk
//!   the innermost axis contiguously and stores move 16 bytes at a time (`uint4`) when
//!   `vector × sizeof(T) == 16`. f16/bf16 data is computed in f32.
//! - Row kernels: a warp (shuffle reductions) or a block (shuffles + shared memory) per row, in
//!   a grid-stride loop over rows; loads of the row are cached in registers (`per_thread` values
//!   per thread, fully unrolled) so each statistic pass and the output pass read memory once.
//!   Where the row is the last axis, a whole number of 16-byte vectors long, each thread caches
//!   whole vectors and every cached load walks the row contiguously, a thread holds runs of
//!   `16 / sizeof(T)` consecutive columns, loaded with one `uint4` each, and writes each output
//!   of that element size a run at a time (`row_vector`): f16 rows move 16 bytes per access
//!   instead of 2. A statistic's per-column value that the outputs use again (softmax's
//!   `exp(x - max)`) is kept in registers by its pass instead of being computed twice (up to
//!   32 columns per lane of a warp per row, 16 per thread of a block per row).
//! - A kernel whose every output is f16 or bf16 computes `exp` (and `sigmoid`) with `__expf`
//!   (an error of 2 + 1.16·|x| f32 ulps, far below an f16 ulp of 2^-10 relative) and divides by
//!   a row statistic (softmax's sum) as a multiplication by its `__frcp_rn`, one value for the
//!   whole row: the accurate `expf` and an IEEE division per element cost f16 softmax over
//!   8,192 columns 15 points of copy bandwidth on an H100 (66% against 81%; bench/RESULTS.md,
//!   session i). f32 and f64 outputs keep the accurate forms.
//! - Index arithmetic is `int` when every extent fits in 31 bits and no buffer holds 64-bit
//!   integers, else `long long`.
//! - [`launch`] gives the grid and block for a device with `sm_count` SMs.
//!
//! ```text
//! extern "C" __global__ void __launch_bounds__(256) fused_add_relu_k0(
//!     const __half* __restrict__ in0, const __half* __restrict__ in1, __half* __restrict__ out0) {
//!   for (I base = (blockIdx.x * blockDim.x + threadIdx.x) * 8; base < 32; base += ...) {
//!     ... uint4 vector load of in0, scalar loads of in1 ...
//!     for (int j = 0; j < 8; ++j) { const float v5 = fmaxf(v3 + v4, 0.0f); st0[j] = ...; }
//!     *reinterpret_cast<uint4*>(out0 + base) = *reinterpret_cast<const uint4*>(st0);
//!   }
//! }
//! ```

use crate::kir::{Bin, Kernel, Node, NodeId, RedOp, Scalar, Schedule, Un};
use crate::schedule::dtype_bytes;
use fusebox_core::ir::DType;
use std::collections::HashMap;
use std::fmt::Write;

/// A kernel's launch configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_mem_bytes: u32,
}

/// The launch configuration of `k` on a device with `sm_count` SMs.
pub fn launch(k: &Kernel, sm_count: u32) -> Launch {
    let cap = u64::from(sm_count.max(1)) * 32;
    let (grid, block) = match k.schedule {
        Schedule::Map { block, vector } => {
            let n: u64 = k.space.iter().product();
            let per = u64::from(block) * u64::from(vector);
            (n.div_ceil(per).clamp(1, cap), block)
        }
        Schedule::WarpPerRow { rows_per_block, .. } => (
            k.rows().div_ceil(u64::from(rows_per_block)).clamp(1, cap),
            32 * rows_per_block,
        ),
        Schedule::BlockPerRow { block, .. } => (k.rows().clamp(1, cap), block),
    };
    Launch {
        grid: [grid as u32, 1, 1],
        block: [block, 1, 1],
        shared_mem_bytes: 0,
    }
}

/// The C type of a storage dtype.
pub fn c_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::I32 => "int",
        DType::I64 => "long long",
        _ => "bool",
    }
}

fn scalar_type(s: Scalar) -> &'static str {
    match s {
        Scalar::F32 => "float",
        Scalar::F64 => "double",
        Scalar::I64 => "I",
    }
}

/// The CUDA source of `k` (see the module doc).
pub fn emit(k: &Kernel) -> String {
    let mut e = Emitter::new(k);
    e.kernel();
    e.finish()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binds {
    /// Nothing: constants.
    Top,
    /// Coordinates (bitmask).
    Coords(u64),
    /// Reduction variables of one reduce.
    RVars(NodeId),
}

struct Scope {
    binds: Binds,
    code: String,
    memo: HashMap<NodeId, String>,
    indent: usize,
}

struct Emitter<'a> {
    k: &'a Kernel,
    scopes: Vec<Scope>,
    deps: HashMap<NodeId, crate::kir::Deps>,
    /// Loads cached in registers (row kernels) or vector-loaded (map kernels): node → array.
    arrays: HashMap<NodeId, String>,
    /// Values a row kernel's statistic pass kept per column for the output pass (softmax's
    /// `exp(x - max)`): node → array of the node's compute scalar.
    kept: HashMap<NodeId, String>,
    /// The array subscript in the current pass (`i` or `j`).
    subscript: &'static str,
    /// Reduce node → the rvar ids it binds.
    reduce_vars: HashMap<NodeId, Vec<u32>>,
    strides: Vec<Vec<u64>>,
    wide: bool,
    fp16: bool,
    bf16: bool,
    /// Every output is f16 or bf16: `exp` through `__expf`, and a division by a row
    /// statistic through its reciprocal (see the module doc).
    fast: bool,
    shared: Vec<Scalar>,
}

impl<'a> Emitter<'a> {
    fn new(k: &'a Kernel) -> Self {
        let roots: Vec<NodeId> = k
            .stores
            .iter()
            .map(|s| s.value)
            .chain(k.stats.iter().map(|s| s.body))
            .collect();
        let deps = k.graph.deps(&roots);
        let strides = k
            .inputs
            .iter()
            .map(|b| {
                let mut s = vec![1u64; b.shape.len()];
                for i in (0..b.shape.len().saturating_sub(1)).rev() {
                    s[i] = s[i + 1] * b.shape[i + 1];
                }
                s
            })
            .collect();
        let big = |n: u64| n >= (1u64 << 31);
        let wide = big(k.space.iter().product())
            || k.inputs
                .iter()
                .chain(&k.outputs)
                .any(|b| big(b.numel()) || matches!(b.dtype, DType::I64));
        let mut fp16 = false;
        let mut bf16 = false;
        for b in k.inputs.iter().chain(&k.outputs) {
            fp16 |= b.dtype == DType::F16;
            bf16 |= b.dtype == DType::BF16;
        }
        let mut reduce_vars = HashMap::new();
        for id in k.graph.topo(&roots) {
            match k.graph.node(id) {
                Node::Convert(DType::F16, _) => fp16 = true,
                Node::Convert(DType::BF16, _) => bf16 = true,
                Node::Reduce { vars, .. } => {
                    reduce_vars.insert(id, vars.iter().map(|v| v.0).collect());
                }
                _ => {}
            }
        }
        Emitter {
            k,
            scopes: vec![Scope {
                binds: Binds::Top,
                code: String::new(),
                memo: HashMap::new(),
                indent: 1,
            }],
            deps,
            arrays: HashMap::new(),
            kept: HashMap::new(),
            subscript: "i",
            reduce_vars,
            strides,
            wide,
            fp16,
            bf16,
            fast: !k.outputs.is_empty()
                && k.outputs
                    .iter()
                    .all(|b| matches!(b.dtype, DType::F16 | DType::BF16)),
            shared: Vec::new(),
        }
    }

    fn finish(self) -> String {
        let k = self.k;
        let mut s = String::new();
        let _ = writeln!(s, "// Generated by fusebox-cuda for `{}`.", k.name);
        if self.fp16 {
            s.push_str("#include <cuda_fp16.h>\n");
        }
        if self.bf16 {
            s.push_str("#include <cuda_bf16.h>\n");
        }
        let _ = writeln!(
            s,
            "typedef {} I;",
            if self.wide { "long long" } else { "int" }
        );
        s.push_str(PRELUDE);
        let block = match k.schedule {
            Schedule::Map { block, .. } | Schedule::BlockPerRow { block, .. } => block,
            Schedule::WarpPerRow { rows_per_block, .. } => 32 * rows_per_block,
        };
        let mut params = Vec::new();
        for (i, b) in k.inputs.iter().enumerate() {
            params.push(format!("const {}* __restrict__ in{i}", c_type(b.dtype)));
        }
        for (i, b) in k.outputs.iter().enumerate() {
            params.push(format!("{}* __restrict__ out{i}", c_type(b.dtype)));
        }
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void __launch_bounds__({block}) {}({}) {{",
            k.name,
            params.join(", ")
        );
        for sc in &self.shared {
            let _ = writeln!(
                s,
                "  __shared__ {} red_{}[33];",
                match sc {
                    Scalar::F32 => "float",
                    Scalar::F64 => "double",
                    Scalar::I64 => "long long",
                },
                short(*sc)
            );
        }
        if let Some(top) = self.scopes.first() {
            s.push_str(&top.code);
        }
        s.push_str("}\n");
        s
    }

    fn line(&mut self, text: &str) {
        if let Some(sc) = self.scopes.last_mut() {
            for _ in 0..sc.indent {
                sc.code.push_str("  ");
            }
            sc.code.push_str(text);
            sc.code.push('\n');
        }
    }

    fn push(&mut self, binds: Binds) {
        let indent = self.scopes.last().map_or(1, |s| s.indent + 1);
        self.scopes.push(Scope {
            binds,
            code: String::new(),
            memo: HashMap::new(),
            indent,
        });
    }

    /// Closes the innermost scope, wrapping its code in `head { ... }`.
    fn pop(&mut self, head: &str) {
        if let Some(sc) = self.scopes.pop() {
            let ind = "  ".repeat(sc.indent.saturating_sub(1));
            if let Some(parent) = self.scopes.last_mut() {
                let _ = writeln!(parent.code, "{ind}{head} {{");
                parent.code.push_str(&sc.code);
                let _ = writeln!(parent.code, "{ind}}}");
            }
        }
    }

    fn coord_mask(&self, from: usize, to: usize) -> u64 {
        (from..to).fold(0, |m, a| m | (1u64 << a.min(63)))
    }

    /// The innermost open scope that binds something `id` depends on.
    fn target(&self, id: NodeId) -> usize {
        let Some(d) = self.deps.get(&id) else {
            return self.scopes.len() - 1;
        };
        let mut t = 0;
        for (i, sc) in self.scopes.iter().enumerate() {
            let needed = match sc.binds {
                Binds::Top => false,
                Binds::Coords(m) => d.coords & m != 0,
                Binds::RVars(r) => self
                    .reduce_vars
                    .get(&r)
                    .is_some_and(|vs| vs.iter().any(|v| d.rvars.contains(v))),
            };
            if needed {
                t = i;
            }
        }
        // A node that uses a row statistic lives at least in the row scope, where they are.
        if d.stats {
            t = t.max(1.min(self.scopes.len() - 1));
        }
        t
    }

    /// The C expression (a local's name or a literal) of node `id`, emitting what it needs.
    fn val(&mut self, id: NodeId) -> String {
        for sc in self.scopes.iter().rev() {
            if let Some(v) = sc.memo.get(&id) {
                return v.clone();
            }
        }
        let g = &self.k.graph;
        let node = g.node(id).clone();
        let s = g.scalar(id);
        // Literals and bound names need no local.
        match &node {
            Node::Int(v) => return int_lit(*v, self.wide),
            Node::Float(bits, sc) => return float_lit(f64::from_bits(*bits), *sc),
            Node::Coord(a) => return format!("c{a}"),
            Node::RVar(v) => return format!("r{v}"),
            Node::Stat(i) => return format!("s{i}"),
            _ => {}
        }
        if let Some(arr) = self.kept.get(&id).cloned() {
            let v = format!("{arr}[{}]", self.subscript);
            return self.bind(id, s, v);
        }
        if let Some(arr) = self.arrays.get(&id).cloned() {
            let v = format!("{arr}[{}]", self.subscript);
            let conv = load_conv(self.k.inputs[load_buf(&node)].dtype, &v);
            return self.bind(id, s, conv);
        }
        let t = self.target(id);
        // Emit into scope `t`: set the scopes above aside while doing so.
        let above = self.scopes.split_off(t + 1);
        let expr = self.expr(id, &node, s);
        let name = self.bind(id, s, expr);
        self.scopes.extend(above);
        name
    }

    fn bind(&mut self, id: NodeId, s: Scalar, text: String) -> String {
        let name = format!("v{id}");
        self.line(&format!("const {} {name} = {text};", scalar_type(s)));
        if let Some(sc) = self.scopes.last_mut() {
            sc.memo.insert(id, name.clone());
        }
        name
    }

    fn expr(&mut self, id: NodeId, node: &Node, s: Scalar) -> String {
        match node {
            Node::Un(op, a) => {
                let x = self.val(*a);
                unary(*op, s, &x, self.fast)
            }
            Node::Bin(op, a, b) => {
                let (x, y) = (self.val(*a), self.val(*b));
                let by_stat = matches!(self.k.graph.node(*b), Node::Stat(_));
                if *op == Bin::Div && s == Scalar::F32 && self.fast && by_stat {
                    // The statistic is row-uniform: the unrolled row loop computes its
                    // reciprocal once (common subexpression), then multiplies.
                    return format!("({x} * __frcp_rn({y}))");
                }
                binary(*op, s, &x, &y)
            }
            Node::Select(c, a, b) => {
                let c = self.val(*c);
                let (x, y) = (self.val(*a), self.val(*b));
                format!("({c} != 0 ? {x} : {y})")
            }
            Node::Convert(d, a) => {
                let x = self.val(*a);
                convert(*d, self.k.graph.scalar(*a), &x)
            }
            Node::Load { buf, index } => {
                let off = self.offset(*buf as usize, index);
                let d = self.k.inputs[*buf as usize].dtype;
                load_conv(d, &format!("in{buf}[{off}]"))
            }
            Node::Reduce { op, vars, body } => {
                let acc = format!("acc{id}");
                self.line(&format!("{} {acc} = {};", scalar_type(s), red_init(*op, s)));
                let mut heads = Vec::new();
                for (v, e) in vars {
                    heads.push(format!("for (I r{v} = 0; r{v} < {e}; ++r{v})"));
                }
                // One scope for all the variables: nested `for` heads, one body.
                self.push(Binds::RVars(id));
                let b = self.val(*body);
                self.line(&format!("{acc} = {};", combine(*op, s, &acc, &b)));
                self.pop(&heads.join(" "));
                acc
            }
            Node::Int(_) | Node::Float(..) | Node::Coord(_) | Node::RVar(_) | Node::Stat(_) => {
                String::new()
            }
        }
    }

    fn offset(&mut self, buf: usize, index: &[NodeId]) -> String {
        let mut terms = Vec::new();
        for (dim, &ix) in index.iter().enumerate() {
            let st = self.strides[buf].get(dim).copied().unwrap_or(1);
            let ext = self.k.inputs[buf].shape.get(dim).copied().unwrap_or(1);
            if ext == 1 {
                continue;
            }
            let v = self.val(ix);
            terms.push(if st == 1 { v } else { format!("{v} * {st}") });
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }

    /// Declares `c{from}..c{to}` from the position `lin` within those axes.
    fn unravel(&mut self, lin: &str, from: usize, to: usize) {
        self.unravel_as(lin, from, to, "");
    }

    /// [`Self::unravel`], naming the last coordinate `c{to-1}{last}`.
    fn unravel_as(&mut self, lin: &str, from: usize, to: usize, last: &str) {
        let k = self.k;
        if from >= to {
            return;
        }
        self.line(&format!("I rem_{from} = {lin};"));
        for a in (from..to).rev() {
            let d = k.space[a];
            let suffix = if a + 1 == to { last } else { "" };
            if a == from {
                self.line(&format!("const I c{a}{suffix} = rem_{from};"));
            } else {
                self.line(&format!("const I c{a}{suffix} = rem_{from} % {d};"));
                self.line(&format!("rem_{from} /= {d};"));
            }
        }
    }

    fn kernel(&mut self) {
        match self.k.schedule {
            Schedule::Map { vector, .. } => self.map_kernel(vector),
            Schedule::WarpPerRow {
                rows_per_block,
                per_thread,
            } => self.row_kernel(32, Some(rows_per_block), per_thread),
            Schedule::BlockPerRow { block, per_thread } => {
                self.row_kernel(block, None, per_thread);
            }
        }
    }

    fn store(&mut self, o: usize, at: &str, value: &str) {
        let d = self.k.outputs[o].dtype;
        let v = store_conv(d, value);
        self.line(&format!("out{o}[{at}] = {v};"));
    }

    fn map_kernel(&mut self, vector: u32) {
        let k = self.k;
        let n: u64 = k.space.iter().product();
        let rank = k.space.len();
        let v = u64::from(vector);
        self.line(&format!(
            "for (I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * {v}; base < {n}; base += (I)gridDim.x * blockDim.x * {v}) {{"
        ));
        if let Some(sc) = self.scopes.last_mut() {
            sc.indent += 1;
        }
        if vector == 1 || rank == 0 {
            self.push(Binds::Coords(self.coord_mask(0, rank)));
            self.unravel("base", 0, rank);
            for s in &k.stores {
                let val = self.val(s.value);
                self.store(s.output as usize, "base", &val);
            }
            let body = self.scopes.pop().map(|s| s.code).unwrap_or_default();
            if let Some(top) = self.scopes.last_mut() {
                top.code.push_str(&body);
            }
        } else {
            let last = rank - 1;
            // Base scope: every coordinate but the last, which starts at c{last}_0.
            self.push(Binds::Coords(self.coord_mask(0, last)));
            self.unravel_as("base", 0, last + 1, "_0");
            let last_node = k
                .graph
                .topo(&k.stores.iter().map(|s| s.value).collect::<Vec<_>>())
                .into_iter()
                .find(|&n| matches!(k.graph.node(n), Node::Coord(a) if *a as usize == last));
            // Vector loads: contiguous along the last axis, 16 bytes.
            let roots: Vec<NodeId> = k.stores.iter().map(|s| s.value).collect();
            let last_bit = 1u64 << last.min(63);
            for id in k.graph.topo(&roots) {
                let Node::Load { buf, index } = k.graph.node(id) else {
                    continue;
                };
                let b = &k.inputs[*buf as usize];
                let contiguous =
                    self.walks_last_axis(id) && v * u64::from(dtype_bytes(b.dtype)) == 16;
                if !contiguous {
                    continue;
                }
                // The offset at the start of the vector (c{last} = c{last}_0 there).
                if let (Some(ln), Some(sc)) = (last_node, self.scopes.last_mut()) {
                    sc.memo.insert(ln, format!("c{last}_0"));
                }
                let off = self.offset(*buf as usize, &index.clone());
                if let (Some(ln), Some(sc)) = (last_node, self.scopes.last_mut()) {
                    sc.memo.remove(&ln);
                }
                let arr = format!("ld{id}");
                self.line(&format!("__align__(16) {} {arr}[{v}];", c_type(b.dtype)));
                self.line(&format!(
                    "*reinterpret_cast<uint4*>({arr}) = *reinterpret_cast<const uint4*>(in{buf} + ({off}));"
                ));
                self.arrays.insert(id, arr);
            }
            let mut vec_stores = Vec::new();
            for s in &k.stores {
                let o = s.output as usize;
                let d = k.outputs[o].dtype;
                if v * u64::from(dtype_bytes(d)) == 16 && !vec_stores.contains(&o) {
                    self.line(&format!("__align__(16) {} st{o}[{v}];", c_type(d)));
                    vec_stores.push(o);
                }
            }
            self.subscript = "j";
            self.push(Binds::Coords(last_bit));
            self.line(&format!("const I c{last} = c{last}_0 + j;"));
            for s in &k.stores {
                let val = self.val(s.value);
                let o = s.output as usize;
                if vec_stores.contains(&o) {
                    let conv = store_conv(k.outputs[o].dtype, &val);
                    self.line(&format!("st{o}[j] = {conv};"));
                } else {
                    self.store(o, "base + j", &val);
                }
            }
            self.pop(&format!(
                "#pragma unroll\n{}for (int j = 0; j < {v}; ++j)",
                "  ".repeat(self.scopes.last().map_or(0, |s| s.indent.saturating_sub(1)))
            ));
            for o in vec_stores {
                self.line(&format!(
                    "*reinterpret_cast<uint4*>(out{o} + base) = *reinterpret_cast<const uint4*>(st{o});"
                ));
            }
            let body = self.scopes.pop().map(|s| s.code).unwrap_or_default();
            if let Some(top) = self.scopes.last_mut() {
                top.code.push_str(&body);
            }
        }
        if let Some(sc) = self.scopes.last_mut() {
            sc.indent -= 1;
        }
        self.line("}");
    }

    /// Whether load `id` walks the space's last axis contiguously: its last index is that
    /// coordinate, its buffer's last extent is the space's, its other indices do not depend on
    /// that coordinate, and no index depends on a reduction variable (so consecutive elements
    /// of the last axis are consecutive in memory, and a run of them is one vector access).
    fn walks_last_axis(&self, id: NodeId) -> bool {
        let k = self.k;
        let Node::Load { buf, index } = k.graph.node(id) else {
            return false;
        };
        let Some(last) = k.space.len().checked_sub(1) else {
            return false;
        };
        let last_bit = 1u64 << last.min(63);
        index
            .last()
            .is_some_and(|&ix| matches!(k.graph.node(ix), Node::Coord(a) if *a as usize == last))
            && k.inputs[*buf as usize].shape.last() == k.space.last()
            && index[..index.len() - 1].iter().all(|ix| {
                self.deps
                    .get(ix)
                    .is_some_and(|d| d.coords & last_bit == 0 && d.rvars.is_empty())
            })
            && self.deps.get(&id).is_some_and(|d| d.rvars.is_empty())
    }

    /// The columns per vector of a row kernel's register cache (1: none): 16 bytes of every
    /// cached load's dtype, when the row is one axis (the last), a whole number of vectors
    /// long, each thread caches whole vectors, and every cached load walks that axis
    /// contiguously from a buffer whose last extent is the row's.
    fn row_vector(&self, cached: &[NodeId], pt: u32) -> u32 {
        let k = self.k;
        let rank = k.space.len();
        if cached.is_empty() || pt == 0 || k.row_axes + 1 != rank {
            return 1;
        }
        let cols = k.cols();
        let mut vec = 0u32;
        for &id in cached {
            let Node::Load { buf, .. } = k.graph.node(id) else {
                return 1;
            };
            let v = 16 / dtype_bytes(k.inputs[*buf as usize].dtype).max(1);
            if !self.walks_last_axis(id) || (vec != 0 && vec != v) {
                return 1;
            }
            vec = v;
        }
        if vec > 1 && cols.is_multiple_of(u64::from(vec)) && pt.is_multiple_of(vec) {
            vec
        } else {
            1
        }
    }

    fn row_kernel(&mut self, threads: u32, warp_rows: Option<u32>, per_thread: u32) {
        let k = self.k;
        let ra = k.row_axes;
        let rank = k.space.len();
        let (rows, cols) = (k.rows(), k.cols());
        match warp_rows {
            Some(rpb) => {
                self.line("const int lane = threadIdx.x & 31;");
                self.line(&format!(
                    "for (I row = (I)blockIdx.x * {rpb} + (threadIdx.x >> 5); row < {rows}; row += (I)gridDim.x * {rpb}) {{"
                ));
            }
            None => {
                self.line("const int lane = threadIdx.x;");
                self.line(&format!(
                    "for (I row = blockIdx.x; row < {rows}; row += gridDim.x) {{"
                ));
            }
        }
        if let Some(sc) = self.scopes.last_mut() {
            sc.indent += 1;
        }
        self.push(Binds::Coords(self.coord_mask(0, ra)));
        self.unravel("row", 0, ra);
        let col_mask = self.coord_mask(ra, rank);
        let row_mask = self.coord_mask(0, ra);
        let pt = per_thread;
        // Loads of the row used by the statistics: cached in registers.
        let cached: Vec<NodeId> = if pt > 0 && !k.stats.is_empty() {
            let bodies: Vec<NodeId> = k.stats.iter().map(|s| s.body).collect();
            k.graph
                .topo(&bodies)
                .into_iter()
                .filter(|id| {
                    matches!(k.graph.node(*id), Node::Load { .. })
                        && self.deps.get(id).is_some_and(|d| {
                            d.coords & col_mask != 0
                                && d.coords & row_mask != 0
                                && d.rvars.is_empty()
                        })
                })
                .collect()
        } else {
            Vec::new()
        };
        let vec = self.row_vector(&cached, pt);
        // Column loop head for a pass.
        let head = |pt: u32| {
            if pt > 0 {
                format!("#pragma unroll\n    for (int i = 0; i < {pt}; ++i)")
            } else {
                format!("for (I col = lane; col < {cols}; col += {threads})")
            }
        };
        // Column `i` of a thread: `lane + i·threads`, or with `vec` > 1 the `i % vec`-th of the
        // thread's `i / vec`-th run of `vec` consecutive columns (16 bytes, one vector load).
        let col_prologue = |e: &mut Self| {
            if pt > 0 {
                if vec > 1 {
                    e.line(&format!(
                        "const I col = (lane + (i / {vec}) * {threads}) * {vec} + (i % {vec});"
                    ));
                } else {
                    e.line(&format!("const I col = lane + i * {threads};"));
                }
                e.line(&format!("if (col < {cols}) {{"));
            }
            e.unravel("col", ra, rank);
        };
        let col_epilogue = |e: &mut Self| {
            if pt > 0 {
                e.line("}");
            }
        };
        // The runs of `vec` columns, for vector loads and stores: `col0` is a run's first.
        let run_head = format!(
            "#pragma unroll\n    for (int g = 0; g < {}; ++g)",
            pt / vec.max(1)
        );
        let run_prologue = |e: &mut Self| {
            e.line(&format!("const I col0 = (lane + g * {threads}) * {vec};"));
            e.line(&format!("if (col0 < {cols}) {{"));
            e.unravel("col0", ra, rank);
        };
        if !cached.is_empty() {
            let arrays: Vec<(NodeId, String)> = cached
                .iter()
                .map(|&id| (id, format!("cache{id}")))
                .collect();
            for (id, arr) in &arrays {
                let b = &k.inputs[load_buf(k.graph.node(*id))];
                self.line(&format!("__align__(16) {} {arr}[{pt}];", c_type(b.dtype)));
            }
            self.push(Binds::Coords(col_mask));
            if vec > 1 {
                run_prologue(self);
            } else {
                col_prologue(self);
            }
            for (id, arr) in &arrays {
                let Node::Load { buf, index } = k.graph.node(*id).clone() else {
                    continue;
                };
                let off = self.offset(buf as usize, &index);
                if vec > 1 {
                    self.line(&format!(
                        "*reinterpret_cast<uint4*>({arr} + g * {vec}) = *reinterpret_cast<const uint4*>(in{buf} + ({off}));"
                    ));
                } else {
                    self.line(&format!("{arr}[i] = in{buf}[{off}];"));
                }
            }
            col_epilogue(self);
            if vec > 1 {
                self.pop(&run_head);
            } else {
                self.pop(&head(pt));
            }
            for (id, arr) in arrays {
                self.arrays.insert(id, arr);
            }
        }
        self.subscript = "i";
        // A statistic's per-column value that the outputs use again (softmax's `exp(x - max)`,
        // summed, then divided by the sum) is kept in registers by its pass rather than
        // computed twice: up to 32 per thread of a warp per row, 16 of a block per row (more
        // costs a block's occupancy: on an H100, f16 softmax over 8,192 columns, 32 per
        // thread of 256, fell from 66% to 50% of copy bandwidth with them kept, while 4,096
        // columns, 16 per thread, rose from 69% to 76%, and 1,024 columns, 32 per lane of a
        // warp, from 88% to 92%); a cached load needs no second copy.
        let store_nodes = k
            .graph
            .topo(&k.stores.iter().map(|s| s.value).collect::<Vec<_>>());
        for (si, st) in k.stats.iter().enumerate() {
            let sc = k.graph.scalar(st.body);
            let acc = format!("sacc{si}");
            self.line(&format!(
                "{} {acc} = {};",
                scalar_type(sc),
                red_init(st.op, sc)
            ));
            let keep = (pt > 0
                && pt <= if warp_rows.is_some() { 32 } else { KEPT_MAX }
                && store_nodes.contains(&st.body)
                && !matches!(k.graph.node(st.body), Node::Load { .. }))
            .then(|| format!("kept{si}"));
            if let Some(arr) = &keep {
                self.line(&format!("{} {arr}[{pt}];", scalar_type(sc)));
            }
            self.push(Binds::Coords(col_mask));
            col_prologue(self);
            let b = self.val(st.body);
            if let Some(arr) = &keep {
                self.line(&format!("{arr}[i] = {b};"));
            }
            self.line(&format!("{acc} = {};", combine(st.op, sc, &acc, &b)));
            col_epilogue(self);
            self.pop(&head(pt));
            if let Some(arr) = keep {
                self.kept.insert(st.body, arr);
            }
            let op = red_name(st.op);
            if warp_rows.is_some() {
                self.line(&format!("{acc} = warp_{op}({acc});"));
            } else {
                if !self.shared.contains(&sc) {
                    self.shared.push(sc);
                }
                self.line(&format!(
                    "{acc} = block_{op}({acc}, red_{}, {});",
                    short(sc),
                    red_init(st.op, sc)
                ));
            }
            self.line(&format!("const {} s{si} = {acc};", scalar_type(sc)));
        }
        // Per-element stores: with `vec` > 1, an output of `vec` × its size = 16 bytes is
        // gathered per thread and written a run (16 bytes) at a time.
        if k.stores.iter().any(|s| !s.per_row) {
            let mut vec_outs: Vec<usize> = Vec::new();
            if vec > 1 {
                for s in k.stores.iter().filter(|s| !s.per_row) {
                    let o = s.output as usize;
                    let d = k.outputs[o].dtype;
                    if u64::from(vec) * u64::from(dtype_bytes(d)) == 16 && !vec_outs.contains(&o) {
                        self.line(&format!("__align__(16) {} st{o}[{pt}];", c_type(d)));
                        vec_outs.push(o);
                    }
                }
            }
            self.push(Binds::Coords(col_mask));
            col_prologue(self);
            for s in k.stores.iter().filter(|s| !s.per_row) {
                let val = self.val(s.value);
                let o = s.output as usize;
                if vec_outs.contains(&o) {
                    let conv = store_conv(k.outputs[o].dtype, &val);
                    self.line(&format!("st{o}[i] = {conv};"));
                } else {
                    self.store(o, &format!("row * {cols} + col"), &val);
                }
            }
            col_epilogue(self);
            self.pop(&head(pt));
            if !vec_outs.is_empty() {
                self.push(Binds::Coords(col_mask));
                self.line(&format!("const I col0 = (lane + g * {threads}) * {vec};"));
                self.line(&format!("if (col0 < {cols}) {{"));
                for o in vec_outs {
                    self.line(&format!(
                        "*reinterpret_cast<uint4*>(out{o} + row * {cols} + col0) = *reinterpret_cast<const uint4*>(st{o} + g * {vec});"
                    ));
                }
                self.line("}");
                self.pop(&run_head);
            }
        }
        let per_row: Vec<_> = k.stores.iter().filter(|s| s.per_row).collect();
        if !per_row.is_empty() {
            self.push(Binds::Coords(col_mask));
            for a in ra..rank {
                self.line(&format!("const I c{a} = 0;"));
            }
            for s in per_row {
                let val = self.val(s.value);
                self.store(s.output as usize, "row", &val);
            }
            self.pop("if (lane == 0)");
        }
        let body = self.scopes.pop().map(|s| s.code).unwrap_or_default();
        if let Some(top) = self.scopes.last_mut() {
            top.code.push_str(&body);
            top.indent -= 1;
        }
        self.line("}");
    }
}

/// The most per-column statistic values a thread of a block-per-row kernel keeps for its output
/// pass (a warp-per-row kernel keeps up to 32).
const KEPT_MAX: u32 = 16;

fn load_buf(n: &Node) -> usize {
    match n {
        Node::Load { buf, .. } => *buf as usize,
        _ => 0,
    }
}

fn short(s: Scalar) -> &'static str {
    match s {
        Scalar::F32 => "f",
        Scalar::F64 => "d",
        Scalar::I64 => "i",
    }
}

fn red_name(op: RedOp) -> &'static str {
    match op {
        RedOp::Sum => "sum",
        RedOp::Max => "max",
        RedOp::Min => "min",
        RedOp::Prod => "prod",
    }
}

fn red_init(op: RedOp, s: Scalar) -> String {
    match (op, s) {
        (RedOp::Sum, Scalar::F32) => "0.0f".into(),
        (RedOp::Sum, Scalar::F64) => "0.0".into(),
        (RedOp::Sum, Scalar::I64) => "0".into(),
        (RedOp::Max, Scalar::I64) => "(I)(-0x7fffffff - 1)".into(),
        (RedOp::Min, Scalar::I64) => "(I)0x7fffffff".into(),
        (RedOp::Max, sc) => float_lit(f64::NEG_INFINITY, sc),
        (RedOp::Min, sc) => float_lit(f64::INFINITY, sc),
        (RedOp::Prod, Scalar::I64) => "1".into(),
        (RedOp::Prod, sc) => float_lit(1.0, sc),
    }
}

fn combine(op: RedOp, s: Scalar, acc: &str, v: &str) -> String {
    match op {
        RedOp::Sum => format!("{acc} + {v}"),
        RedOp::Max => binary(Bin::Max, s, acc, v),
        RedOp::Min => binary(Bin::Min, s, acc, v),
        RedOp::Prod => format!("{acc} * {v}"),
    }
}

fn int_lit(v: i64, wide: bool) -> String {
    if wide || v > i64::from(i32::MAX) || v < i64::from(i32::MIN) {
        format!("{v}LL")
    } else {
        format!("{v}")
    }
}

fn float_lit(v: f64, s: Scalar) -> String {
    match s {
        Scalar::F64 => {
            if v.is_nan() {
                "__longlong_as_double(0x7ff8000000000000LL)".into()
            } else if v.is_infinite() {
                if v > 0.0 {
                    "__longlong_as_double(0x7ff0000000000000LL)".into()
                } else {
                    "__longlong_as_double(0xfff0000000000000LL)".into()
                }
            } else {
                format!("{v:e}")
            }
        }
        _ => {
            let f = v as f32;
            if f.is_nan() {
                "__int_as_float(0x7fc00000)".into()
            } else if f.is_infinite() {
                if f > 0.0 {
                    "__int_as_float(0x7f800000)".into()
                } else {
                    "__int_as_float(0xff800000)".into()
                }
            } else {
                format!("{f:e}f")
            }
        }
    }
}

/// `op` applied to `x` in scalar type `s`; `fast`: the kernel's outputs are all 16-bit floats,
/// so `exp` (and `sigmoid`) may take `__expf` (see the module doc).
fn unary(op: Un, s: Scalar, x: &str, fast: bool) -> String {
    let f = s == Scalar::F32;
    match (op, s) {
        (Un::Exp, Scalar::F32) if fast => format!("__expf({x})"),
        (Un::Sigmoid, Scalar::F32) if fast => format!("__frcp_rn(1.0f + __expf(-{x}))"),
        (Un::Neg, _) => format!("(-{x})"),
        (Un::Abs, Scalar::I64) => format!("({x} < 0 ? -{x} : {x})"),
        (Un::Abs, _) => format!("{}({x})", if f { "fabsf" } else { "fabs" }),
        (Un::Exp, _) => format!("{}({x})", if f { "expf" } else { "exp" }),
        (Un::Log, _) => format!("{}({x})", if f { "logf" } else { "log" }),
        (Un::Sqrt, _) => format!("{}({x})", if f { "sqrtf" } else { "sqrt" }),
        (Un::Rsqrt, _) => format!("{}({x})", if f { "rsqrtf" } else { "rsqrt" }),
        (Un::Tanh, _) => format!("{}({x})", if f { "tanhf" } else { "tanh" }),
        (Un::Erf, _) => format!("{}({x})", if f { "erff" } else { "erf" }),
        (Un::Sigmoid, Scalar::F32) => format!("(1.0f / (1.0f + expf(-{x})))"),
        (Un::Sigmoid, _) => format!("(1.0 / (1.0 + exp(-{x})))"),
        (Un::Floor | Un::Ceil | Un::Round, Scalar::I64) => x.to_string(),
        (Un::Sign, Scalar::I64) => format!("((I)({x} > 0) - (I)({x} < 0))"),
        (Un::Sign, sc) => format!(
            "({x} > {z} ? {} : ({x} < {z} ? {} : {x}))",
            float_lit(1.0, sc),
            float_lit(-1.0, sc),
            z = float_lit(0.0, sc)
        ),
        (Un::IsNan | Un::IsInf, Scalar::I64) => "(I)0".to_string(),
        (Un::IsNan | Un::IsInf, sc) => format!(
            "({}({x}) ? {} : {})",
            if op == Un::IsNan { "isnan" } else { "isinf" },
            float_lit(1.0, sc),
            float_lit(0.0, sc)
        ),
        (Un::BitNot, _) => format!("(~{x})"),
        (
            Un::Floor
            | Un::Ceil
            | Un::Round
            | Un::Sin
            | Un::Cos
            | Un::Tan
            | Un::Asin
            | Un::Acos
            | Un::Atan
            | Un::Sinh
            | Un::Cosh
            | Un::Asinh
            | Un::Acosh
            | Un::Atanh,
            _,
        ) => {
            let name = match op {
                Un::Floor => "floor",
                Un::Ceil => "ceil",
                Un::Round => "rint",
                Un::Sin => "sin",
                Un::Cos => "cos",
                Un::Tan => "tan",
                Un::Asin => "asin",
                Un::Acos => "acos",
                Un::Atan => "atan",
                Un::Sinh => "sinh",
                Un::Cosh => "cosh",
                Un::Asinh => "asinh",
                Un::Acosh => "acosh",
                _ => "atanh",
            };
            format!("{name}{}({x})", if f { "f" } else { "" })
        }
    }
}

fn binary(op: Bin, s: Scalar, x: &str, y: &str) -> String {
    let f = s == Scalar::F32;
    match (op, s) {
        (Bin::Add, _) => format!("({x} + {y})"),
        (Bin::Sub, _) => format!("({x} - {y})"),
        (Bin::Mul, _) => format!("({x} * {y})"),
        (Bin::Div, Scalar::I64) => format!("({y} == 0 ? (I)0 : {x} / {y})"),
        (Bin::Div, _) => format!("({x} / {y})"),
        (Bin::Rem, _) => format!("({y} == 0 ? (I)0 : {x} % {y})"),
        (Bin::Pow, _) => format!("{}({x}, {y})", if f { "powf" } else { "pow" }),
        (Bin::Max, Scalar::I64) => format!("({x} > {y} ? {x} : {y})"),
        (Bin::Min, Scalar::I64) => format!("({x} < {y} ? {x} : {y})"),
        (Bin::Max, _) => format!("{}({x}, {y})", if f { "fmaxf" } else { "fmax" }),
        (Bin::Min, _) => format!("{}({x}, {y})", if f { "fminf" } else { "fmin" }),
        (Bin::Lt, Scalar::I64) => format!("(I)({x} < {y})"),
        (Bin::Lt, sc) => format!(
            "(({x} < {y}) ? {} : {})",
            float_lit(1.0, sc),
            float_lit(0.0, sc)
        ),
        (Bin::Eq | Bin::Ne | Bin::Le, sc) => {
            let c = match op {
                Bin::Eq => "==",
                Bin::Ne => "!=",
                _ => "<=",
            };
            if sc == Scalar::I64 {
                format!("(I)({x} {c} {y})")
            } else {
                format!(
                    "(({x} {c} {y}) ? {} : {})",
                    float_lit(1.0, sc),
                    float_lit(0.0, sc)
                )
            }
        }
        (Bin::BitAnd, _) => format!("({x} & {y})"),
        (Bin::BitOr, _) => format!("({x} | {y})"),
        (Bin::BitXor, _) => format!("({x} ^ {y})"),
        (Bin::Shl, _) => {
            format!("(({y}) < 0 || ({y}) >= 64 ? (I)0 : (I)((unsigned long long)({x}) << ({y})))")
        }
        (Bin::Shr, _) => format!("(I)((long long)({x}) >> (({y}) < 0 || ({y}) > 63 ? 63 : ({y})))"),
        (Bin::TruncMod, Scalar::I64) => format!("({y} == 0 ? (I)0 : {x} % {y})"),
        (Bin::TruncMod, _) => format!("{}({x}, {y})", if f { "fmodf" } else { "fmod" }),
        (Bin::FloorMod, Scalar::I64) => format!(
            "({y} == 0 ? (I)0 : (({x} % {y} != 0 && (({x} % {y} < 0) != ({y} < 0))) ? {x} % {y} + {y} : {x} % {y}))"
        ),
        (Bin::FloorMod, sc) => {
            let r = format!("{}({x}, {y})", if f { "fmodf" } else { "fmod" });
            let z = float_lit(0.0, sc);
            format!("(({r} != {z} && (({r} < {z}) != ({y} < {z}))) ? {r} + {y} : {r})")
        }
    }
}

/// A stored element `v` of dtype `d` as the compute scalar.
fn load_conv(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("__half2float({v})"),
        DType::BF16 => format!("__bfloat162float({v})"),
        DType::F32 | DType::F64 => v.to_string(),
        _ => format!("(I)({v})"),
    }
}

/// A compute value `v` as a stored element of dtype `d`.
fn store_conv(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("__float2half_rn((float)({v}))"),
        DType::BF16 => format!("__float2bfloat16_rn((float)({v}))"),
        DType::F32 => format!("(float)({v})"),
        DType::F64 => format!("(double)({v})"),
        DType::Bool => format!("({v} != 0)"),
        DType::I64 => format!("(long long)({v})"),
        d => format!("({})(long long)({v})", c_type(d)),
    }
}

/// `astype`: `x` (of scalar `from`) stored as `d` and read back, in `d`'s compute scalar.
fn convert(d: DType, from: Scalar, x: &str) -> String {
    let _ = from;
    match d {
        DType::F16 => format!("__half2float(__float2half_rn((float)({x})))"),
        DType::BF16 => format!("__bfloat162float(__float2bfloat16_rn((float)({x})))"),
        DType::F32 => format!("(float)({x})"),
        DType::F64 => format!("(double)({x})"),
        DType::Bool => format!("(I)({x} != 0)"),
        DType::I64 => format!("(I)(long long)({x})"),
        d => format!("(I)({})(long long)({x})", c_type(d)),
    }
}

const PRELUDE: &str = r#"
__device__ __forceinline__ float red_max_(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double red_max_(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ long long red_max_(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ int red_max_(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ float red_min_(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double red_min_(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ long long red_min_(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ int red_min_(int a, int b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = red_max_(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T> __device__ __forceinline__ T warp_min(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = red_min_(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
#define FUSEBOX_BLOCK_REDUCE(NAME, WARP)                                         \
  template <typename T, typename S> __device__ __forceinline__ T NAME(T v, S* buf, T init) { \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                  \
    v = WARP(v);                                                                 \
    __syncthreads();                                                             \
    if (lane == 0) buf[warp] = v;                                                \
    __syncthreads();                                                             \
    const int warps = (blockDim.x + 31) >> 5;                                    \
    T w = (threadIdx.x < warps) ? (T)buf[threadIdx.x] : init;                    \
    if (warp == 0) w = WARP(w);                                                  \
    if (threadIdx.x == 0) buf[32] = w;                                           \
    __syncthreads();                                                             \
    return (T)buf[32];                                                           \
  }
FUSEBOX_BLOCK_REDUCE(block_sum, warp_sum)
FUSEBOX_BLOCK_REDUCE(block_max, warp_max)
FUSEBOX_BLOCK_REDUCE(block_min, warp_min)
template <typename T> __device__ __forceinline__ T warp_prod(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
FUSEBOX_BLOCK_REDUCE(block_prod, warp_prod)
"#;
