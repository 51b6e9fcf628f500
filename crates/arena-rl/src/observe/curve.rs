//! The reward curve: `rollout/reward` per step (and `eval-rollout/reward` where evaluated) as a PNG.
//!
//! Drawn with plotters' bitmap backend. Its text needs system fonts, which clusters often lack, so the few
//! labels (tick values, axis names, legend) are drawn from a small built-in 5x7 pixel font instead.
//! A light grid has lines at rewards 0, 0.25, 0.5, 0.75 and 1 (the y axis spans
//! `[min(0, lowest), max(1, highest)]`); the training curve is blue and the evaluation points orange.

use std::path::Path;

use crate::error::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

#[cfg(test)]
mod tests;

/// Image size in pixels.
const SIZE: (u32, u32) = (800, 480);
/// Pixels per font pixel.
const SCALE: i32 = 2;
const ORANGE: RGBColor = RGBColor(255, 140, 0);

/// Writes the curve to `path` (800x480).
pub fn draw(path: &Path, train: &[(u64, f64)], eval: &[(u64, f64)]) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| Error::failed(format!("cannot draw {}", path.display()), e);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    render(&root, train, eval).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Draws the curve on `root`.
fn render<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    train: &[(u64, f64)],
    eval: &[(u64, f64)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let last = train
        .iter()
        .chain(eval)
        .map(|(s, _)| *s)
        .max()
        .unwrap_or(0)
        .max(1);
    let lo = train.iter().chain(eval).map(|(_, r)| *r).fold(0.0, f64::min);
    let hi = train.iter().chain(eval).map(|(_, r)| *r).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(root)
        .margin_top(40)
        .margin_right(24)
        .margin_left(72)
        .margin_bottom(56)
        .build_cartesian_2d(0f64..last as f64, lo..hi)?;
    let grid = RGBColor(220, 220, 220);
    for y in [0.0, 0.25, 0.5, 0.75, 1.0] {
        chart.draw_series(LineSeries::new([(0.0, y), (last as f64, y)], grid))?;
    }
    chart.draw_series(LineSeries::new(
        [(0.0, lo), (0.0, hi), (0.0, lo), (last as f64, lo)],
        BLACK,
    ))?;
    chart.draw_series(LineSeries::new(
        train.iter().map(|(s, r)| (*s as f64, *r)),
        BLUE.stroke_width(2),
    ))?;
    chart.draw_series(
        eval.iter()
            .map(|(s, r)| Circle::new((*s as f64, *r), 4, ORANGE.filled())),
    )?;

    // Labels, in pixels: tick values left of the y axis and under the x axis, then the axis names and the
    // legend.
    let at = |x: f64, y: f64| chart.backend_coord(&(x, y));
    let (glyph_w, glyph_h) = (6 * SCALE, 7 * SCALE);
    for (y, label) in [
        (0.0, "0"),
        (0.25, "0.25"),
        (0.5, "0.5"),
        (0.75, "0.75"),
        (1.0, "1"),
    ] {
        if y < lo || y > hi {
            continue;
        }
        let (px, py) = at(0.0, y);
        let width = label.len() as i32 * glyph_w;
        text(root, label, (px - 8 - width, py - glyph_h / 2), &BLACK)?;
    }
    for step in ticks(last) {
        let label = step.to_string();
        let (px, py) = at(step as f64, lo);
        let width = label.len() as i32 * glyph_w;
        text(root, &label, (px - width / 2, py + 8), &BLACK)?;
    }
    let (x_end, y_bottom) = at(last as f64, lo);
    text(
        root,
        "STEP",
        (x_end - 4 * glyph_w, y_bottom + 12 + glyph_h + 4),
        &BLACK,
    )?;
    let (x_axis, y_top) = at(0.0, hi);
    text(root, "REWARD", (x_axis - 8 * SCALE, y_top - glyph_h - 12), &BLACK)?;
    let legend_x = x_end - 16 * glyph_w;
    let legend_y = y_top - glyph_h - 12;
    root.draw(&PathElement::new(
        [
            (legend_x, legend_y + glyph_h / 2),
            (legend_x + 24, legend_y + glyph_h / 2),
        ],
        BLUE.stroke_width(2),
    ))?;
    text(root, "TRAIN", (legend_x + 30, legend_y), &BLACK)?;
    if !eval.is_empty() {
        let x = legend_x + 30 + 6 * glyph_w;
        root.draw(&Circle::new((x + 8, legend_y + glyph_h / 2), 4, ORANGE.filled()))?;
        text(root, "EVAL", (x + 18, legend_y), &BLACK)?;
    }
    Ok(())
}

/// Round step numbers for the x axis: multiples of 1, 2 or 5 times a power of ten, at most six of them, up
/// to `last`.
fn ticks(last: u64) -> Vec<u64> {
    let mut spacing = 1u64;
    'search: loop {
        for m in [1, 2, 5] {
            if last / (spacing * m) < 6 {
                spacing *= m;
                break 'search;
            }
        }
        spacing *= 10;
    }
    (0..=last / spacing).map(|i| i * spacing).collect()
}

/// Draws `s` with its top-left corner at `(x, y)`, letters in capitals; characters the font lacks are left
/// blank.
pub(crate) fn text<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &str,
    (x, y): (i32, i32),
    color: &RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, c) in s.chars().enumerate() {
        let Some(rows) = glyph(c.to_ascii_uppercase()) else {
            continue;
        };
        let x0 = x + i as i32 * 6 * SCALE;
        for (r, bits) in rows.iter().enumerate() {
            for col in 0..5 {
                if bits & (0b10000 >> col) != 0 {
                    let (px, py) = (x0 + col * SCALE, y + r as i32 * SCALE);
                    root.draw(&Rectangle::new(
                        [(px, py), (px + SCALE - 1, py + SCALE - 1)],
                        color.filled(),
                    ))?;
                }
            }
        }
    }
    Ok(())
}

/// The 5x7 glyph of `c`: seven rows, the leftmost pixel in bit 4.
fn glyph(c: char) -> Option<[u8; 7]> {
    Some(match c {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        '_' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '@' => [0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E],
        ':' => [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '[' => [0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E],
        ']' => [0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E],
        '+' => [0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '=' => [0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00],
        _ => return None,
    })
}
