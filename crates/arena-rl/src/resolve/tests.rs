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
