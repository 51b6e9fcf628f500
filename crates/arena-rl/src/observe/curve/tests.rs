//! Unit tests for the reward curve: the labels are really drawn, in the built-in font.

use super::*;

/// Renders into an RGB buffer.
fn pixels(train: &[(u64, f64)], eval: &[(u64, f64)]) -> Vec<u8> {
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        render(&root, train, eval).expect("drawn");
        root.present().expect("presented");
    }
    buf
}

/// Black pixels inside a rectangle `[x0, x1) x [y0, y1)`.
fn black_in(buf: &[u8], (x0, x1): (u32, u32), (y0, y1): (u32, u32)) -> usize {
    let mut n = 0;
    for y in y0..y1 {
        for x in x0..x1 {
            let i = ((y * SIZE.0 + x) * 3) as usize;
            if buf[i..i + 3] == [0, 0, 0] {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn tick_labels_and_axis_names_are_drawn() {
    let train: Vec<(u64, f64)> = (0..100).map(|s| (s, 0.3 + 0.005 * s as f64)).collect();
    let buf = pixels(&train, &[(50, 0.6)]);
    // Left margin (y tick values) and bottom margin (x tick values and "STEP") carry text.
    assert!(black_in(&buf, (0, 64), (40, 424)) > 100, "y tick labels");
    assert!(
        black_in(&buf, (72, 800), (430, 480)) > 100,
        "x tick labels and axis name"
    );
    // "REWARD" above the plot, at its left.
    assert!(black_in(&buf, (40, 200), (0, 40)) > 50, "y axis name");
}

#[test]
fn every_glyph_fits_five_by_seven_and_unknown_characters_are_blank() {
    for c in "0123456789.ADEILNPRSTVW".chars() {
        let rows = glyph(c).expect("in the font");
        assert!(rows.iter().all(|r| *r < 32), "{c} is five pixels wide");
        assert!(rows.iter().any(|r| *r != 0), "{c} draws something");
    }
    assert_eq!(glyph('?'), None);
    assert_eq!(glyph('a'), None);
}

#[test]
fn step_ticks_are_round_numbers() {
    assert_eq!(ticks(1), [0, 1]);
    assert_eq!(ticks(5), [0, 1, 2, 3, 4, 5]);
    assert_eq!(ticks(7), [0, 2, 4, 6]);
    assert_eq!(ticks(299), [0, 50, 100, 150, 200, 250]);
    assert_eq!(ticks(300), [0, 100, 200, 300]);
    assert_eq!(ticks(150), [0, 50, 100, 150]);
    assert_eq!(ticks(12_345), [0, 5000, 10_000]);
}

#[test]
fn an_empty_run_still_draws_axes() {
    let buf = pixels(&[], &[]);
    assert!(black_in(&buf, (0, 800), (0, 480)) > 100);
}
