//! Linear least squares with box bounds, shared by the fits: normal equations solved by
//! Gauss-Jordan elimination (a handful of unknowns), and every way of holding parameters at
//! their bounds tried (exact for box bounds at this size).

/// The normal equations of `rows` (features, target): X^T X and X^T y.
struct Gram {
    xtx: Vec<Vec<f64>>,
    xty: Vec<f64>,
}

impl Gram {
    fn new(rows: &[(Vec<f64>, f64)], n: usize) -> Gram {
        let mut xtx = vec![vec![0.0; n]; n];
        let mut xty = vec![0.0; n];
        for (x, y) in rows {
            for i in 0..n {
                for j in 0..n {
                    xtx[i][j] += x[i] * x[j];
                }
                xty[i] += x[i] * y;
            }
        }
        Gram { xtx, xty }
    }

    /// Least squares over the free columns; fixed columns keep their value. None when the free
    /// columns are not independent.
    fn solve(&self, fixed: &[Option<f64>]) -> Option<Vec<f64>> {
        let n = fixed.len();
        let free: Vec<usize> = (0..n).filter(|&j| fixed[j].is_none()).collect();
        let m = free.len();
        let mut a = vec![vec![0.0; m + 1]; m];
        for (r, &i) in free.iter().enumerate() {
            for (c, &j) in free.iter().enumerate() {
                a[r][c] = self.xtx[i][j];
            }
            a[r][m] = self.xty[i]
                - (0..n)
                    .filter_map(|k| fixed[k].map(|v| v * self.xtx[i][k]))
                    .sum::<f64>();
        }
        // Gauss-Jordan with partial pivoting (at most four unknowns).
        for c in 0..m {
            let p = (c..m).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
            if a[p][c].abs() < 1e-12 {
                return None;
            }
            a.swap(c, p);
            let pivot = a[c].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != c {
                    let f = row[c] / pivot[c];
                    for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                        *x -= f * p;
                    }
                }
            }
        }
        let mut out: Vec<f64> = fixed.iter().map(|f| f.unwrap_or(0.0)).collect();
        for (r, &j) in free.iter().enumerate() {
            out[j] = a[r][m] / a[r][r];
        }
        Some(out)
    }
}

/// Least squares of `rows` (features, target) over the free columns; fixed columns keep their
/// value. Returns None when the free columns are not independent.
pub(crate) fn lstsq(rows: &[(Vec<f64>, f64)], fixed: &[Option<f64>]) -> Option<Vec<f64>> {
    Gram::new(rows, fixed.len()).solve(fixed)
}

/// Least squares with each parameter held inside `[lo, hi]` (each side may be infinite): every
/// way of holding some parameters at a finite limit is solved, and the feasible solution with
/// the smallest squared residual wins (exact for box bounds; at most four parameters here).
/// The normal equations are formed once for all the ways.
pub(crate) fn bounded_lstsq(rows: &[(Vec<f64>, f64)], lo: &[f64], hi: &[f64]) -> Option<Vec<f64>> {
    let n = lo.len();
    let gram = Gram::new(rows, n);
    let sse = |x: &[f64]| -> f64 {
        rows.iter()
            .map(|(f, y)| (f.iter().zip(x).map(|(a, b)| a * b).sum::<f64>() - y).powi(2))
            .sum()
    };
    let mut best: Option<(f64, Vec<f64>)> = None;
    // Each parameter: free, at its lower limit or at its upper limit.
    for code in 0..3usize.pow(n as u32) {
        let mut fixed = vec![None; n];
        let mut c = code;
        let mut possible = true;
        for j in 0..n {
            let limit = match c % 3 {
                0 => None,
                1 => Some(lo[j]),
                _ => Some(hi[j]),
            };
            c /= 3;
            if let Some(l) = limit {
                if !l.is_finite() {
                    possible = false;
                }
                fixed[j] = Some(l);
            }
        }
        if !possible {
            continue;
        }
        let Some(x) = gram.solve(&fixed) else {
            continue;
        };
        if (0..n).all(|j| lo[j] - 1e-12 <= x[j] && x[j] <= hi[j] + 1e-12) {
            let e = sse(&x);
            if best.as_ref().is_none_or(|b| e < b.0) {
                best = Some((e, x));
            }
        }
    }
    best.map(|b| b.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_an_exact_line_and_respects_bounds() {
        let rows: Vec<(Vec<f64>, f64)> = (0..6)
            .map(|i| {
                let x = i as f64;
                (vec![1.0, x], 3.0 + 2.0 * x)
            })
            .collect();
        let x = lstsq(&rows, &[None, None]).unwrap();
        assert!(
            (x[0] - 3.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9,
            "{x:?}"
        );
        // Slope held at <= 1: the intercept refits to the best line of slope 1.
        let x = bounded_lstsq(&rows, &[f64::NEG_INFINITY; 2], &[f64::INFINITY, 1.0]).unwrap();
        assert_eq!(x[1], 1.0);
        assert!((x[0] - (3.0 + 2.5)).abs() < 1e-9, "{x:?}");
        // A bound that does not bind changes nothing.
        let x = bounded_lstsq(&rows, &[0.0, 0.0], &[f64::INFINITY; 2]).unwrap();
        assert!(
            (x[0] - 3.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9,
            "{x:?}"
        );
        // Intercept held at >= 10: the slope refits below the data.
        let x = bounded_lstsq(&rows, &[10.0, f64::NEG_INFINITY], &[f64::INFINITY; 2]).unwrap();
        assert_eq!(x[0], 10.0);
        let x = bounded_lstsq(&rows, &[f64::NEG_INFINITY; 2], &[f64::INFINITY, 1.0]).unwrap();
        assert_eq!(x[1], 1.0);
        assert!((x[0] - (3.0 + 2.5)).abs() < 1e-9, "{x:?}");
        // Dependent columns cannot be fitted.
        let rows = vec![(vec![1.0, 2.0], 1.0), (vec![2.0, 4.0], 2.0)];
        assert!(lstsq(&rows, &[None, None]).is_none());
    }
}
