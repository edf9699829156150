//! Measured tables, read by piecewise-linear interpolation: a cost known at a few points is
//! priced between them on the straight line through the two neighbours, at the first point's
//! value below the table, and on the last segment's slope above it (a measured slope, where a
//! line fitted through two distant points would miss every point between them).

/// A measured table: `(x, y)` points in increasing `x`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Table(pub &'static [(f64, f64)]);

impl Table {
    /// The table's value at `x` (see the module docs). A table of one point is a constant; an
    /// empty table is zero.
    pub fn at(&self, x: f64) -> f64 {
        let pts = self.0;
        match pts {
            [] => 0.0,
            [(_, y)] => *y,
            [(x0, y0), ..] if x <= *x0 => *y0,
            _ => {
                let i = pts
                    .windows(2)
                    .position(|w| x <= w[1].0)
                    .unwrap_or(pts.len() - 2);
                let ((xa, ya), (xb, yb)) = (pts[i], pts[i + 1]);
                ya + (yb - ya) * (x - xa) / (xb - xa)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    const T: Table = Table(&[(1.0, 10.0), (3.0, 20.0), (7.0, 60.0)]);

    #[test]
    fn interpolates_between_points_and_reproduces_them() {
        assert_eq!(T.at(1.0), 10.0);
        assert_eq!(T.at(2.0), 15.0);
        assert_eq!(T.at(3.0), 20.0);
        assert_eq!(T.at(5.0), 40.0);
        assert_eq!(T.at(7.0), 60.0);
    }

    #[test]
    fn holds_the_first_value_below_and_extends_the_last_slope_above() {
        assert_eq!(T.at(0.0), 10.0);
        assert_eq!(T.at(9.0), 80.0);
        assert_eq!(Table(&[(4.0, 2.5)]).at(100.0), 2.5);
        assert_eq!(Table(&[]).at(1.0), 0.0);
    }
}
