//! A CPU evaluator of the kernel IR: runs a [`Kernel`] on host tensors exactly as the CUDA code
//! means it, so every lowering is checked against the CPU reference without a GPU.
//!
//! Contract:
//!
//! - [`evaluate`] computes the kernel's stores for every element (or, with a sample limit, for a
//!   deterministic sample of elements — whole rows for row kernels — always including the first
//!   and the last; elements that reduce over more than 64 values count for more against the
//!   limit), returning `(linear index, value)` pairs per output.
//! - Semantics: `f32` nodes are rounded to `f32` after every operation, `f64` nodes are exact,
//!   integer nodes truncate like C; loads convert to the compute scalar; stores and
//!   [`Node::Convert`] round to the storage dtype (nearest even for f16/bf16, saturating for
//!   integers). Row statistics are accumulated in column order.
//! - Inputs must match the kernel's input buffers in dtype and shape; an index outside a buffer
//!   (a lowering bug) is an [`Error::Eval`], not a panic.
//!
//! ```text
//! kernel: space [2, 3], out0[c0,c1] = max(load x[c0,c1], 0)
//! evaluate(k, [x = [[-1, 2, -3], [4, -5, 6]]], None) -> out0: [(0,0), (1,2), (2,0), (3,4), (4,0), (5,6)]
//! ```

use crate::error::{Error, Result};
use crate::kir::{Bin, Kernel, Node, NodeId, RedOp, Scalar, Un};
use fusebox_core::ir::DType;
use fusebox_core::runtime::Tensor;

/// The values computed for each output: `(linear index, value)`, in index order.
pub type Evaluated = Vec<Vec<(usize, f64)>>;

/// Evaluates `k` on `inputs` (one per kernel input); `limit` bounds the elements computed.
pub fn evaluate(k: &Kernel, inputs: &[Tensor], limit: Option<usize>) -> Result<Evaluated> {
    if inputs.len() != k.inputs.len() {
        return Err(Error::Eval(format!(
            "expected {} inputs, found {}",
            k.inputs.len(),
            inputs.len()
        )));
    }
    let mut data = Vec::new();
    for (t, b) in inputs.iter().zip(&k.inputs) {
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        if shape != b.shape || t.dtype() != b.dtype {
            return Err(Error::Eval(format!(
                "input `{}`: expected {} {:?}, found {} {:?}",
                b.name,
                b.dtype,
                b.shape,
                t.dtype(),
                shape
            )));
        }
        data.push(t.to_f64_vec());
    }
    let roots: Vec<NodeId> = k
        .stores
        .iter()
        .map(|s| s.value)
        .chain(k.stats.iter().map(|s| s.body))
        .collect();
    let deps = k.graph.deps(&roots);
    let n = k.graph.len();
    let mut has_rvar = vec![false; n];
    for (id, d) in &deps {
        has_rvar[*id as usize] = !d.rvars.is_empty();
    }
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
    let mut ev = Ev {
        k,
        data,
        strides,
        has_rvar,
        memo: vec![(0, 0.0); n],
        generation: 0,
        coords: vec![0; k.space.len()],
        rvars: Vec::new(),
        stats: vec![0.0; k.stats.len()],
        error: None,
    };
    let mut out: Evaluated = vec![Vec::new(); k.outputs.len()];
    let ra = k.row_axes;
    let rows = k.rows() as usize;
    let cols = k.cols() as usize;
    let total = rows.saturating_mul(cols);
    // With a limit, elements that each reduce over many values count for more: the budget is
    // `limit` elements of 64 reduced values each (at least 16 elements).
    let work: u64 = k
        .graph
        .topo(&roots)
        .iter()
        .filter_map(|&id| match k.graph.node(id) {
            Node::Reduce { vars, .. } => Some(vars.iter().map(|v| v.1).product::<u64>()),
            _ => None,
        })
        .max()
        .unwrap_or(1)
        .max(1);
    let limit = match limit {
        None => usize::MAX,
        Some(l) => {
            let scaled = (l as u64).saturating_mul(64) / work.max(64);
            (scaled as usize).clamp(16.min(l), l.max(1))
        }
    };
    if k.is_row() {
        let want_rows = if total <= limit {
            rows
        } else {
            (limit / cols.max(1)).clamp(1, rows)
        };
        for row in sample(rows, want_rows) {
            ev.set_coords(row, 0, ra);
            for (si, st) in k.stats.iter().enumerate() {
                let mut acc = init(st.op, k.graph.scalar(st.body));
                for col in 0..cols {
                    ev.set_coords(col, ra, k.space.len());
                    let v = ev.eval(st.body);
                    acc = combine(st.op, acc, v, k.graph.scalar(st.body));
                }
                ev.stats[si] = acc;
            }
            for col in 0..cols {
                ev.set_coords(col, ra, k.space.len());
                for s in k.stores.iter().filter(|s| !s.per_row) {
                    let v = ev.eval(s.value);
                    push(&mut out, k, s.output, row * cols + col, v);
                }
            }
            ev.set_coords(0, ra, k.space.len());
            for s in k.stores.iter().filter(|s| s.per_row) {
                let v = ev.eval(s.value);
                push(&mut out, k, s.output, row, v);
            }
        }
    } else {
        for i in sample(total, total.min(limit)) {
            ev.set_coords(i, 0, k.space.len());
            for s in &k.stores {
                let v = ev.eval(s.value);
                push(&mut out, k, s.output, i, v);
            }
        }
    }
    if let Some(e) = ev.error {
        return Err(Error::Eval(e));
    }
    Ok(out)
}

fn push(out: &mut Evaluated, k: &Kernel, o: u32, at: usize, v: f64) {
    let d = k.outputs.get(o as usize).map_or(DType::F32, |b| b.dtype);
    if let Some(list) = out.get_mut(o as usize) {
        list.push((at, convert(d, v)));
    }
}

/// `want` indices out of `0..n`, evenly spaced, always with the first and the last.
fn sample(n: usize, want: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    if want >= n {
        return (0..n).collect();
    }
    let want = want.max(2);
    let mut v: Vec<usize> = (0..want).map(|i| i * (n - 1) / (want - 1)).collect();
    v.dedup();
    v
}

fn init(op: RedOp, s: Scalar) -> f64 {
    match (op, s) {
        (RedOp::Sum, _) => 0.0,
        (RedOp::Max, Scalar::I64) => i64::MIN as f64,
        (RedOp::Min, Scalar::I64) => i64::MAX as f64,
        (RedOp::Max, _) => f64::NEG_INFINITY,
        (RedOp::Min, _) => f64::INFINITY,
        (RedOp::Prod, _) => 1.0,
    }
}

fn combine(op: RedOp, acc: f64, v: f64, s: Scalar) -> f64 {
    let r = match op {
        RedOp::Sum => acc + v,
        RedOp::Max => acc.max(v),
        RedOp::Min => acc.min(v),
        RedOp::Prod => acc * v,
    };
    round(s, r)
}

fn round(s: Scalar, v: f64) -> f64 {
    match s {
        Scalar::F32 => f64::from(v as f32),
        Scalar::F64 => v,
        Scalar::I64 => v.trunc(),
    }
}

/// A value stored as `d` and read back.
pub fn convert(d: DType, v: f64) -> f64 {
    match d {
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F32 => f64::from(v as f32),
        DType::F64 => v,
        DType::Bool => f64::from(u8::from(v != 0.0)),
        DType::I8 => f64::from((v as i64) as i8),
        DType::U8 => f64::from((v as i64) as u8),
        DType::I32 => f64::from((v as i64) as i32),
        _ => (v as i64) as f64,
    }
}

/// The error function: its Taylor series below 2 (to 1e-17), Abramowitz & Stegun 7.1.26 above
/// (|error| < 1.5e-7, where erf is within 5e-3 of 1).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a > 6.0 {
        return x.signum();
    }
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let mut y = 1.0 - poly * (-a * a).exp();
    if a < 2.0 {
        let mut s = 0.0;
        let mut term = a;
        let mut n = 0.0;
        while term.abs() > 1e-17 && n < 200.0 {
            s += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -a * a / n;
        }
        y = s * 2.0 / std::f64::consts::PI.sqrt();
    }
    y.copysign(x)
}

struct Ev<'a> {
    k: &'a Kernel,
    data: Vec<Vec<f64>>,
    strides: Vec<Vec<u64>>,
    has_rvar: Vec<bool>,
    memo: Vec<(u32, f64)>,
    generation: u32,
    coords: Vec<i64>,
    rvars: Vec<(u32, i64)>,
    stats: Vec<f64>,
    error: Option<String>,
}

impl Ev<'_> {
    /// Sets coordinates `from..to` from the row-major position `lin` within them.
    fn set_coords(&mut self, mut lin: usize, from: usize, to: usize) {
        for a in (from..to).rev() {
            let d = self.k.space[a].max(1) as usize;
            self.coords[a] = (lin % d) as i64;
            lin /= d;
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.memo.iter_mut().for_each(|m| m.0 = u32::MAX);
            self.generation = 1;
        }
    }

    fn eval(&mut self, id: NodeId) -> f64 {
        let i = id as usize;
        let memo_ok = !self.has_rvar.get(i).copied().unwrap_or(true);
        if memo_ok && self.memo[i].0 == self.generation {
            return self.memo[i].1;
        }
        let k: &Kernel = self.k;
        let g = &k.graph;
        let s = g.scalar(id);
        let v = match g.node(id) {
            Node::Coord(a) => self.coords.get(*a as usize).copied().unwrap_or(0) as f64,
            Node::RVar(r) => self
                .rvars
                .iter()
                .rev()
                .find(|(x, _)| x == r)
                .map_or(0.0, |(_, v)| *v as f64),
            Node::Int(v) => *v as f64,
            Node::Float(bits, _) => round(s, f64::from_bits(*bits)),
            Node::Stat(n) => self.stats.get(*n as usize).copied().unwrap_or(0.0),
            Node::Un(op, a) => {
                let x = self.eval(*a);
                round(s, unary(*op, x))
            }
            Node::Bin(op, a, b) => {
                let (x, y) = (self.eval(*a), self.eval(*b));
                round(s, binary(*op, x, y, s))
            }
            Node::Select(c, a, b) => {
                if self.eval(*c) != 0.0 {
                    self.eval(*a)
                } else {
                    self.eval(*b)
                }
            }
            Node::Convert(d, a) => {
                let x = self.eval(*a);
                convert(*d, x)
            }
            Node::Load { buf, index } => {
                let buf = *buf as usize;
                let mut off: u64 = 0;
                let mut ok = true;
                for (dim, ix) in index.iter().enumerate() {
                    let v = self.eval(*ix) as i64;
                    let ext = k.inputs.get(buf).map_or(0, |b| b.shape[dim]);
                    if v < 0 || v as u64 >= ext {
                        ok = false;
                        break;
                    }
                    off += v as u64 * self.strides[buf][dim];
                }
                match self.data.get(buf).and_then(|d| d.get(off as usize)) {
                    Some(v) if ok => *v,
                    _ => {
                        if self.error.is_none() {
                            self.error = Some(format!(
                                "kernel `{}` reads input {buf} out of bounds",
                                self.k.name
                            ));
                        }
                        0.0
                    }
                }
            }
            Node::Reduce { op, vars, body } => {
                let (op, body) = (*op, *body);
                let bs = g.scalar(body);
                let mut acc = init(op, bs);
                let total: u64 = vars.iter().map(|v| v.1).product();
                let base = self.rvars.len();
                for (v, _) in vars {
                    self.rvars.push((*v, 0));
                }
                for mut lin in 0..total {
                    for (j, (_, e)) in vars.iter().enumerate().rev() {
                        let e = (*e).max(1);
                        self.rvars[base + j].1 = (lin % e) as i64;
                        lin /= e;
                    }
                    let v = self.eval(body);
                    acc = combine(op, acc, v, bs);
                }
                self.rvars.truncate(base);
                acc
            }
        };
        if memo_ok {
            self.memo[i] = (self.generation, v);
        }
        v
    }
}

fn unary(op: Un, x: f64) -> f64 {
    match op {
        Un::Neg => -x,
        Un::Abs => x.abs(),
        Un::Exp => x.exp(),
        Un::Log => x.ln(),
        Un::Sqrt => x.sqrt(),
        Un::Rsqrt => 1.0 / x.sqrt(),
        Un::Tanh => x.tanh(),
        Un::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Un::Erf => erf(x),
        Un::Floor => x.floor(),
        Un::Ceil => x.ceil(),
        Un::Round => x.round_ties_even(),
        Un::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        Un::Sin => x.sin(),
        Un::Cos => x.cos(),
        Un::Tan => x.tan(),
        Un::Asin => x.asin(),
        Un::Acos => x.acos(),
        Un::Atan => x.atan(),
        Un::Sinh => x.sinh(),
        Un::Cosh => x.cosh(),
        Un::Asinh => x.asinh(),
        Un::Acosh => x.acosh(),
        Un::Atanh => x.atanh(),
        Un::IsNan => f64::from(u8::from(x.is_nan())),
        Un::IsInf => f64::from(u8::from(x.is_infinite())),
        Un::BitNot => !(x as i64) as f64,
    }
}

fn binary(op: Bin, x: f64, y: f64, s: Scalar) -> f64 {
    let int = s == Scalar::I64;
    match op {
        Bin::Add => x + y,
        Bin::Sub => x - y,
        Bin::Mul => x * y,
        Bin::Div if int => {
            if y == 0.0 {
                0.0
            } else {
                ((x as i64) / (y as i64)) as f64
            }
        }
        Bin::Div => x / y,
        Bin::Pow => x.powf(y),
        Bin::Max => x.max(y),
        Bin::Min => x.min(y),
        Bin::Lt => f64::from(u8::from(x < y)),
        Bin::Rem => {
            if y == 0.0 {
                0.0
            } else {
                ((x as i64) % (y as i64)) as f64
            }
        }
        Bin::Eq => f64::from(u8::from(x == y)),
        Bin::Ne => f64::from(u8::from(x != y)),
        Bin::Le => f64::from(u8::from(x <= y)),
        Bin::BitAnd => ((x as i64) & (y as i64)) as f64,
        Bin::BitOr => ((x as i64) | (y as i64)) as f64,
        Bin::BitXor => ((x as i64) ^ (y as i64)) as f64,
        Bin::Shl => {
            let n = y as i64;
            if (0..64).contains(&n) {
                (x as i64).wrapping_shl(n as u32) as f64
            } else {
                0.0
            }
        }
        Bin::Shr => {
            let n = y as i64;
            let n = if (0..64).contains(&n) { n } else { 63 };
            ((x as i64) >> n) as f64
        }
        Bin::TruncMod | Bin::FloorMod if int => {
            let (a, b) = (x as i64, y as i64);
            if b == 0 {
                return 0.0;
            }
            let r = a.wrapping_rem(b);
            if op == Bin::FloorMod && r != 0 && (r < 0) != (b < 0) {
                r.wrapping_add(b) as f64
            } else {
                r as f64
            }
        }
        Bin::TruncMod => x % y,
        Bin::FloorMod => {
            let r = x % y;
            if r != 0.0 && (r < 0.0) != (y < 0.0) {
                r + y
            } else {
                r
            }
        }
    }
}
