//! The reward curve: `rollout/reward` per step (and `eval-rollout/reward` where evaluated) as a PNG.
//!
//! Drawn with plotters' bitmap backend and no text at all, so it needs no system fonts: a light grid with
//! lines at rewards 0, 0.25, 0.5, 0.75 and 1 (the y axis spans `[min(0, lowest), max(1, highest)]`), the
//! training curve in blue and the evaluation points in orange.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// Writes the curve to `path` (800x480).
pub fn draw(path: &Path, train: &[(u64, f64)], eval: &[(u64, f64)]) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let last = train
        .iter()
        .chain(eval)
        .map(|(s, _)| *s)
        .max()
        .unwrap_or(0)
        .max(1);
    let lo = train.iter().chain(eval).map(|(_, r)| *r).fold(0.0, f64::min);
    let hi = train.iter().chain(eval).map(|(_, r)| *r).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .margin(24)
        .build_cartesian_2d(0f64..last as f64, lo..hi)
        .map_err(|e| err(&e))?;
    let grid = RGBColor(220, 220, 220);
    for y in [0.0, 0.25, 0.5, 0.75, 1.0] {
        chart
            .draw_series(LineSeries::new([(0.0, y), (last as f64, y)], grid))
            .map_err(|e| err(&e))?;
    }
    chart
        .draw_series(LineSeries::new(
            [(0.0, lo), (0.0, hi), (0.0, lo), (last as f64, lo)],
            BLACK,
        ))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            train.iter().map(|(s, r)| (*s as f64, *r)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            eval.iter()
                .map(|(s, r)| Circle::new((*s as f64, *r), 4, RGBColor(255, 140, 0).filled())),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
