//! Parsing `relax.einsum` equations (numpy / ONNX semantics), shared by type inference and
//! the backends.
//!
//! Contract: [`EinsumSpec::parse`] takes the equation and the rank of every operand and gives,
//! per operand, the label of each of its dims (an ellipsis expanded to the broadcast batch
//! labels), the output's labels, and how many labels there are. Labels are letters `a-zA-Z`;
//! `...` stands for the leading broadcast dims (right-aligned across operands, as numpy).
//! Without `->` the output is the ellipsis dims followed by the labels used exactly once, in
//! alphabetical order (numpy's implicit mode). A label repeated in one operand takes its
//! diagonal; a label missing from the output is summed over. Errors (never panics) say what
//! is wrong with the equation.
//!
//! ```text
//! R.einsum((q, k), subscripts="bhid,bhjd->bhij")   # q: (2, 4, 8, 16), k: (2, 4, 10, 16)
//!   -> R.Tensor((2, 4, 8, 10))
//! R.einsum((x,), subscripts="ii->i")               # the diagonal of a square matrix
//! ```

/// A parsed equation; labels are numbered `0..n_labels`, the ellipsis labels first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EinsumSpec {
    /// Per operand, the label of each dim, in dim order.
    pub inputs: Vec<Vec<usize>>,
    /// The output's labels, in dim order (each at most once).
    pub output: Vec<usize>,
    /// How many distinct labels (ellipsis dims included).
    pub n_labels: usize,
    /// How many labels the ellipsis stands for (they are labels `0..n_ellipsis`).
    pub n_ellipsis: usize,
}

/// One operand's subscripts: letters, with the ellipsis (if any) at `ellipsis` letters in.
struct Term {
    letters: Vec<u8>,
    ellipsis: Option<usize>,
}

fn parse_term(s: &str, what: &str) -> Result<Term, String> {
    let b = s.trim().as_bytes();
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut i = 0;
    while i < b.len() {
        match b.get(i) {
            Some(&c) if c.is_ascii_alphabetic() => {
                letters.push(c);
                i += 1;
            }
            Some(b'.') => {
                if b.get(i..i + 3) != Some(b"...".as_slice()) {
                    return Err(format!("einsum: {what} `{s}` has a `.` outside `...`"));
                }
                if ellipsis.is_some() {
                    return Err(format!("einsum: {what} `{s}` has more than one `...`"));
                }
                ellipsis = Some(letters.len());
                i += 3;
            }
            Some(b' ') => i += 1,
            Some(&c) => {
                return Err(format!(
                    "einsum: {what} `{s}` has the character `{}`; expected letters and `...`",
                    char::from(c)
                ));
            }
            None => break,
        }
    }
    Ok(Term { letters, ellipsis })
}

impl EinsumSpec {
    /// Parses `eq` for operands of the given ranks (see the module docs).
    pub fn parse(eq: &str, ranks: &[usize]) -> Result<EinsumSpec, String> {
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq, None),
        };
        let terms: Vec<Term> = lhs
            .split(',')
            .enumerate()
            .map(|(i, t)| parse_term(t, &format!("operand {i}")))
            .collect::<Result<_, _>>()?;
        if terms.len() != ranks.len() {
            return Err(format!(
                "einsum: the equation `{eq}` names {} operand(s), {} given",
                terms.len(),
                ranks.len()
            ));
        }
        // How many dims each ellipsis covers; they broadcast, right-aligned.
        let mut n_ellipsis = 0usize;
        let mut ell_of = Vec::with_capacity(terms.len());
        for (i, (t, &r)) in terms.iter().zip(ranks).enumerate() {
            let n = match t.ellipsis {
                Some(_) => r.checked_sub(t.letters.len()).ok_or_else(|| {
                    format!(
                        "einsum: operand {i} has rank {r}, fewer than the {} labels of its \
                         subscripts",
                        t.letters.len()
                    )
                })?,
                None if t.letters.len() == r => 0,
                None => {
                    return Err(format!(
                        "einsum: operand {i} has rank {r} but its subscripts name {} dims",
                        t.letters.len()
                    ));
                }
            };
            n_ellipsis = n_ellipsis.max(n);
            ell_of.push(n);
        }
        // Letters → label ids after the ellipsis labels, in order of first use.
        let mut letters: Vec<u8> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let mut inputs = Vec::with_capacity(terms.len());
        for (t, &ne) in terms.iter().zip(&ell_of) {
            let mut dims = Vec::with_capacity(t.letters.len() + ne);
            for (j, &c) in t.letters.iter().enumerate() {
                if t.ellipsis == Some(j) {
                    dims.extend(n_ellipsis - ne..n_ellipsis);
                }
                let id = match letters.iter().position(|&l| l == c) {
                    Some(p) => p,
                    None => {
                        letters.push(c);
                        counts.push(0);
                        letters.len() - 1
                    }
                };
                if let Some(n) = counts.get_mut(id) {
                    *n += 1;
                }
                dims.push(n_ellipsis + id);
            }
            if t.ellipsis == Some(t.letters.len()) {
                dims.extend(n_ellipsis - ne..n_ellipsis);
            }
            inputs.push(dims);
        }
        let output = match rhs {
            Some(r) => {
                let t = parse_term(r, "the output")?;
                let mut out = Vec::with_capacity(t.letters.len() + n_ellipsis);
                // An output without `...` sums the ellipsis dims away.
                for (j, &c) in t.letters.iter().enumerate() {
                    if t.ellipsis == Some(j) {
                        out.extend(0..n_ellipsis);
                    }
                    let id = letters.iter().position(|&l| l == c).ok_or_else(|| {
                        format!(
                            "einsum: the output label `{}` does not appear in any operand",
                            char::from(c)
                        )
                    })?;
                    if out.contains(&(n_ellipsis + id)) {
                        return Err(format!(
                            "einsum: the output label `{}` is repeated",
                            char::from(c)
                        ));
                    }
                    out.push(n_ellipsis + id);
                }
                if t.ellipsis == Some(t.letters.len()) {
                    out.extend(0..n_ellipsis);
                }
                out
            }
            None => {
                let mut once: Vec<(u8, usize)> = letters
                    .iter()
                    .zip(&counts)
                    .enumerate()
                    .filter(|(_, (_, n))| **n == 1)
                    .map(|(id, (&c, _))| (c, n_ellipsis + id))
                    .collect();
                once.sort_unstable();
                (0..n_ellipsis)
                    .chain(once.into_iter().map(|x| x.1))
                    .collect()
            }
        };
        Ok(EinsumSpec {
            inputs,
            output,
            n_labels: n_ellipsis + letters.len(),
            n_ellipsis,
        })
    }

    /// The extent of every label given the operands' extents (`None` where a label's extent
    /// is not known; two uses of a label must be `same`, symbolic extents equal as
    /// polynomials). Ellipsis labels broadcast (an extent of 1 yields to the other).
    pub fn label_extents<D: Clone>(
        &self,
        shapes: &[&[D]],
        same: impl Fn(&D, &D) -> bool,
        is_one: impl Fn(&D) -> bool,
        describe: impl Fn(&D) -> String,
    ) -> Result<Vec<Option<D>>, String> {
        let mut ext: Vec<Option<D>> = vec![None; self.n_labels];
        for (i, (labels, shape)) in self.inputs.iter().zip(shapes).enumerate() {
            if labels.len() != shape.len() {
                return Err(format!(
                    "einsum: operand {i} has rank {}, expected {}",
                    shape.len(),
                    labels.len()
                ));
            }
            for (&l, d) in labels.iter().zip(shape.iter()) {
                let Some(slot) = ext.get_mut(l) else {
                    continue;
                };
                match slot {
                    None => *slot = Some(d.clone()),
                    Some(prev) if same(prev, d) => {}
                    Some(prev) if l < self.n_ellipsis && is_one(prev) => *slot = Some(d.clone()),
                    Some(_) if l < self.n_ellipsis && is_one(d) => {}
                    Some(prev) => {
                        return Err(format!(
                            "einsum: operand {i} gives a label extent {} where another use \
                             gives {}",
                            describe(d),
                            describe(prev)
                        ));
                    }
                }
            }
        }
        Ok(ext)
    }
}

#[cfg(test)]
mod tests {
    use super::EinsumSpec;

    #[test]
    fn parses_the_common_equations() {
        let s = EinsumSpec::parse("bhid,bhjd->bhij", &[4, 4]).unwrap();
        assert_eq!(s.inputs, vec![vec![0, 1, 2, 3], vec![0, 1, 4, 3]]);
        assert_eq!(s.output, vec![0, 1, 2, 4]);
        let s = EinsumSpec::parse("...ij,...jk->...ik", &[4, 3]).unwrap();
        assert_eq!(s.n_ellipsis, 2);
        assert_eq!(s.inputs, vec![vec![0, 1, 2, 3], vec![1, 3, 4]]);
        assert_eq!(s.output, vec![0, 1, 2, 4]);
        // Implicit output: labels used once, alphabetically.
        let s = EinsumSpec::parse("ji,jk", &[2, 2]).unwrap();
        assert_eq!(s.output, vec![1, 2]);
        let s = EinsumSpec::parse("ii", &[2]).unwrap();
        assert!(s.output.is_empty());
    }

    #[test]
    fn rejects_bad_equations() {
        for (eq, ranks) in [
            ("ij,jk->ik", &[2usize][..]),
            ("ij->k", &[2]),
            ("ij->ii", &[2]),
            ("ij", &[3]),
            ("i.j", &[2]),
            ("i$", &[2]),
            ("......", &[2]),
        ] {
            assert!(EinsumSpec::parse(eq, ranks).is_err(), "{eq}");
        }
    }
}
