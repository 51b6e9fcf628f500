use super::{Batch, Sequence, sha256_hex};
use crate::protocol::StepKind;

fn sample() -> Batch {
    let seq = |n: usize, adv: f32| Sequence {
        tokens: (0..n as u32).map(|t| t * 7 + 1).collect(),
        loss_mask: (0..n).map(|t| t >= n / 2).collect(),
        logprobs: (0..n).map(|t| -(t as f32) / 10.0).collect(),
        versions: (0..n).map(|t| if t >= n / 2 { 3 } else { -1 }).collect(),
        temperatures: (0..n).map(|t| [0.0, 0.7, 1.0][t % 3]).collect(),
        truncated: (0..n).map(|t| t % 4 == 1).collect(),
        advantage: adv,
        weight: 1.0 / n as f32,
    };
    Batch {
        kind: StepKind::Grpo,
        step: 12,
        policy_version: 4,
        sequences: vec![seq(5, 0.5), seq(9, -1.25), seq(2, 0.0)],
        group_sizes: vec![2, 1],
    }
}

#[test]
fn a_written_batch_reads_back_as_written_with_the_hash_of_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trainer/batches/step-12.safetensors");
    let batch = sample();
    let sha = batch.write(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(sha, sha256_hex(&bytes));
    assert_eq!(sha.len(), 64);
    assert_eq!(Batch::read(&path).unwrap(), batch);
    assert!(
        !dir.path()
            .join("trainer/batches/step-12.safetensors.tmp")
            .exists()
    );
    // The layout is the protocol's: names, dtypes and flat shapes, and the metadata.
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(meta["protocol"], "arena-rl-trainer/1");
    assert_eq!(meta["kind"], "grpo");
    assert_eq!(meta["step"], "12");
    assert_eq!(meta["policy_version"], "4");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let shape = |n: &str| {
        (
            format!("{:?}", st.tensor(n).unwrap().dtype()),
            st.tensor(n).unwrap().shape().to_vec(),
        )
    };
    assert_eq!(shape("tokens"), ("I32".into(), vec![16]));
    assert_eq!(shape("loss_mask"), ("U8".into(), vec![16]));
    assert_eq!(shape("versions"), ("I64".into(), vec![16]));
    assert_eq!(shape("offsets"), ("I64".into(), vec![4]));
    assert_eq!(shape("advantages"), ("F32".into(), vec![3]));
    assert_eq!(shape("weights"), ("F32".into(), vec![3]));
    assert_eq!(shape("group_sizes"), ("I64".into(), vec![2]));
    let offsets: Vec<i64> = st
        .tensor("offsets")
        .unwrap()
        .data()
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(offsets, [0, 5, 14, 16]);
}

#[test]
fn bad_batches_are_refused_naming_the_sequence_and_field() {
    let check = |edit: fn(&mut Batch), want: &str| {
        let mut b = sample();
        edit(&mut b);
        let err = b.to_bytes().unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} does not contain {want:?}");
    };
    check(
        |b| b.sequences[1].logprobs.pop().map(drop).unwrap_or(()),
        "sequence 1: logprobs has 8 entries for 9 tokens",
    );
    check(
        |b| b.sequences[0].loss_mask[0] = true,
        "sequence 0: loss_mask[0] is set",
    );
    check(
        |b| b.group_sizes = vec![3, 1],
        "group_sizes [3, 1] do not split 3 sequences",
    );
    check(
        |b| b.sequences[2].weight = f32::NAN,
        "sequence 2: advantage 0 and weight NaN",
    );
    check(|b| b.sequences.clear(), "the batch has no sequences");
    check(
        |b| b.sequences[0].tokens[1] = u32::MAX,
        "sequence 0: a token id does not fit in i32",
    );
}

#[test]
fn a_truncated_or_foreign_file_is_refused() {
    let bytes = sample().to_bytes().unwrap();
    assert!(Batch::from_bytes(&bytes[..bytes.len() - 3]).is_err());
    let mut other = bytes.clone();
    let at = other
        .windows(18)
        .position(|w| w == b"arena-rl-trainer/1")
        .unwrap();
    other[at + 17] = b'9';
    let err = Batch::from_bytes(&other).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("arena-rl-trainer/9"), "{err}");
}

#[test]
fn the_same_batch_gives_the_same_bytes_every_time() {
    let first = sample().to_bytes().unwrap();
    for _ in 0..20 {
        assert_eq!(sample().to_bytes().unwrap(), first);
    }
    assert_eq!(Batch::from_bytes(&first).unwrap(), sample());
}
