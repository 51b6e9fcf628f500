//! `eval.png`: one row per group (all, each Stream, each domain), the checkpoint's pass rate as a blue bar
//! with its Wilson interval as a whisker, and the baseline's in orange beneath it.
//!
//! Drawn in pixels with plotters' bitmap backend and the reward curve's built-in pixel font, so it needs no
//! system fonts.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Figures;
use super::stats::Summary;
use crate::error::{Error, Result};
use crate::observe::curve::text;

const GLYPH_W: i32 = 12;
const GLYPH_H: i32 = 14;
const PLOT_W: i32 = 600;
const ORANGE: RGBColor = RGBColor(255, 140, 0);

/// Writes the chart to `path`.
pub fn draw(path: &Path, figures: &Figures) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| Error::failed(format!("cannot draw {}", path.display()), e);
    let labels: Vec<String> = figures.candidate.iter().map(|(k, _)| k.to_string()).collect();
    let label_w = labels.iter().map(String::len).max().unwrap_or(3) as i32 * GLYPH_W + 24;
    let row_h = if figures.baseline.is_some() { 48 } else { 30 };
    let size = (
        (label_w + PLOT_W + 48) as u32,
        (96 + labels.len() as i32 * row_h + 48) as u32,
    );
    let root = BitMapBackend::new(path, size).into_drawing_area();
    render(&root, figures, &labels, label_w, row_h).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn render<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    figures: &Figures,
    labels: &[String],
    x0: i32,
    row_h: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let top = 72;
    let bottom = top + labels.len() as i32 * row_h;
    let x = |v: f64| x0 + (v.clamp(0.0, 1.0) * f64::from(PLOT_W)).round() as i32;
    text(
        root,
        &format!("PASS RATE, 95% WILSON INTERVALS, K={}", figures.k),
        (x0, 12),
        &BLACK,
    )?;
    text(root, "CHECKPOINT", (x0 + 28, 40), &BLACK)?;
    root.draw(&Rectangle::new(
        [(x0, 40), (x0 + 20, 40 + GLYPH_H)],
        BLUE.filled(),
    ))?;
    if figures.baseline.is_some() {
        let bx = x0 + 28 + 12 * GLYPH_W;
        root.draw(&Rectangle::new(
            [(bx, 40), (bx + 20, 40 + GLYPH_H)],
            ORANGE.filled(),
        ))?;
        text(root, "BASELINE", (bx + 28, 40), &BLACK)?;
    }
    for (v, label) in [
        (0.0, "0"),
        (0.25, "0.25"),
        (0.5, "0.5"),
        (0.75, "0.75"),
        (1.0, "1"),
    ] {
        let px = x(v);
        root.draw(&PathElement::new(
            [(px, top - 4), (px, bottom)],
            RGBColor(220, 220, 220),
        ))?;
        let w = label.len() as i32 * GLYPH_W;
        text(root, label, (px - w / 2, bottom + 8), &BLACK)?;
    }
    for (i, (key, summary)) in figures.candidate.iter().enumerate() {
        let y = top + i as i32 * row_h + 6;
        text(root, &labels[i], (8, y + 2), &BLACK)?;
        bar(root, summary, y, &BLUE, &x)?;
        let base = figures.baseline.iter().flatten().find(|(k, _)| k == key);
        if let Some((_, b)) = base {
            bar(root, b, y + 18, &ORANGE, &x)?;
        }
    }
    root.draw(&PathElement::new([(x0, top - 4), (x0, bottom)], BLACK))?;
    Ok(())
}

/// One pass rate: a bar from 0 and a whisker over its interval.
fn bar<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &Summary,
    y: i32,
    color: &RGBColor,
    x: &impl Fn(f64) -> i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (Some(p), Some(ci)) = (s.pass_rate, s.interval) else {
        return Ok(());
    };
    root.draw(&Rectangle::new(
        [(x(0.0), y), (x(p).max(x(0.0) + 1), y + 14)],
        color.filled(),
    ))?;
    let mid = y + 7;
    let (lo, hi) = (x(ci.lo), x(ci.hi));
    root.draw(&PathElement::new([(lo, mid), (hi, mid)], BLACK.stroke_width(2)))?;
    for end in [lo, hi] {
        root.draw(&PathElement::new(
            [(end, mid - 5), (end, mid + 5)],
            BLACK.stroke_width(2),
        ))?;
    }
    Ok(())
}
