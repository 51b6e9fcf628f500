//! The row cursor: batches per epoch with and without `drop_last`, shuffles per epoch, no repeats.

use super::*;

fn steps(cursor: &RowCursor, n: u64) -> Vec<Vec<usize>> {
    (0..n).map(|k| cursor.step_indices(k)).collect()
}

#[test]
fn drop_last_drops_the_tail_and_keeps_every_batch_full() {
    let cursor = RowCursor::new(10, 4, false, true, 0);
    assert_eq!(cursor.batches_per_epoch(), 2);
    assert_eq!(cursor.dropped_tail(), 2);
    assert_eq!(
        steps(&cursor, 3),
        [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![0, 1, 2, 3]]
    );
}

#[test]
fn without_drop_last_the_epoch_ends_with_a_short_batch() {
    let cursor = RowCursor::new(10, 4, false, false, 0);
    assert_eq!(cursor.batches_per_epoch(), 3);
    assert_eq!(cursor.dropped_tail(), 0);
    assert_eq!(
        steps(&cursor, 4),
        [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9], vec![0, 1, 2, 3]]
    );
    // Fewer rows than one batch: one short batch per epoch, never a row twice in a batch.
    let small = RowCursor::new(3, 8, false, false, 0);
    assert_eq!(steps(&small, 2), [vec![0, 1, 2], vec![0, 1, 2]]);
    assert_eq!(RowCursor::new(3, 8, false, true, 0).batches_per_epoch(), 0);
}

#[test]
fn shuffled_epochs_cover_every_row_once_and_differ() {
    let cursor = RowCursor::new(12, 4, true, false, 7);
    let epoch = |e: u64| -> Vec<usize> { (e * 3..e * 3 + 3).flat_map(|k| cursor.step_indices(k)).collect() };
    let (first, second) = (epoch(0), epoch(1));
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..12).collect::<Vec<_>>());
    assert_ne!(first, second, "a new shuffle each epoch");
    assert_eq!(
        cursor.step_indices(4),
        RowCursor::new(12, 4, true, false, 7).step_indices(4),
        "deterministic"
    );
}

#[test]
fn extra_draws_come_from_outside_the_batch_in_a_fixed_order_per_step() {
    let cursor = RowCursor::new(12, 4, true, false, 7);
    let batch = cursor.step_indices(2);
    let extra = cursor.extra_indices(2, 0, 8);
    assert!(extra.iter().all(|i| !batch.contains(i)), "{extra:?} vs {batch:?}");
    let mut sorted = extra.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        8,
        "no row twice before every other row was drawn: {extra:?}"
    );
    // A draw index names one row, whatever range asks for it: a resumed run redraws what it journaled.
    assert_eq!(cursor.extra_indices(2, 3, 2), extra[3..5].to_vec());
    assert_ne!(
        cursor.extra_indices(3, 0, 8),
        extra,
        "each step has its own order"
    );
    // More draws than rows outside the batch cycle; a batch of every row draws from all of them.
    assert_eq!(cursor.extra_indices(2, 8, 1), vec![extra[0]]);
    let all = RowCursor::new(3, 8, false, false, 0);
    let mut drawn = all.extra_indices(0, 0, 3);
    drawn.sort_unstable();
    assert_eq!(drawn, vec![0, 1, 2]);
    assert!(
        RowCursor::new(0, 4, false, false, 0)
            .extra_indices(0, 0, 3)
            .is_empty()
    );
}
