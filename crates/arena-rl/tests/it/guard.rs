//! `arena-rl guard check` through the real binary: commands and exported trajectories on stdin, the
//! built-in rules, a run config's rules per Stream, and malformed lines.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::support::smollm2;

fn check(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args(["guard", "check"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the arena-rl binary runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Each output line's `(line, [rule ids])`, or `(line, ["error"])`.
fn rules(out: &Output) -> Vec<(u64, Vec<String>)> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let ids = match v.get("error") {
                Some(_) => vec!["error".to_string()],
                None => v["hits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h["rule"].as_str().unwrap().to_string())
                    .collect(),
            };
            (v["line"].as_u64().unwrap(), ids)
        })
        .collect()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

const COMMANDS: &str = "git status\n\
cd /testbed && git --no-pager log --all --oneline | head\n\
\n\
bash -lc 'git reflog'\n\
git show 0a1b2c3d\n\
curl -s https://example.org/x\n";

#[test]
fn commands_are_audited_one_line_each_with_the_built_in_rules_and_exit_0() {
    let out = check(&[], COMMANDS.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        rules(&out),
        [
            (1, ids(&[])),
            (2, ids(&["git-log-all-refs"])),
            (4, ids(&["git-reflog"])),
            (5, ids(&["git-object-by-hash"])),
            (6, ids(&[])),
        ]
    );
    let first: Value = serde_json::from_slice(out.stdout.split(|b| *b == b'\n').nth(1).unwrap()).unwrap();
    assert_eq!(first["hits"][0]["matched"], "git log --all --oneline");
    // The task's base commit is no evidence.
    let out = check(&["--base-commit", "0a1b2c3d4e5f"], b"git show 0a1b2c3d\n");
    assert_eq!(rules(&out), [(1, ids(&[]))]);
    // An alias defined on one line counts on a later one only as one session.
    let session = b"alias h='git log --all'\nh\n";
    assert_eq!(rules(&check(&[], session)), [(1, ids(&[])), (2, ids(&[]))]);
    assert_eq!(
        rules(&check(&["--session"], session)),
        [(1, ids(&[])), (2, ids(&["git-log-all-refs"]))]
    );
}

#[test]
fn a_malformed_line_is_named_and_the_rest_still_audited() {
    let out = check(&["--input", "commands"], b"git reflog\n\xff\xfe\ngit log --all\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        rules(&out),
        [
            (1, ids(&["git-reflog"])),
            (2, ids(&["error"])),
            (3, ids(&["git-log-all-refs"]))
        ]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2: not UTF-8 text"), "{stderr}");
    let out = check(&["--input", "export"], b"{\"session_id\": 3}\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 1: not an exported trajectory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_config(dir: &Path) -> String {
    let path = dir.join("run.yaml");
    std::fs::write(
        &path,
        "experiment_name: e\ntrial_name: t\n\
         econfig:\n  arena_streams:\n    - {name: swe, stream_id: s1}\n    - {name: math, stream_id: s2}\n\
         guard:\n  disable: [git-reflog]\n  rules:\n    - id: no-curl\n      category: network-fetch\n      programs: [curl]\n\
         \x20 streams:\n    math:\n      builtin: false\n      rules: []\n",
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn a_run_config_gives_its_rules_per_stream() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let out = check(&["--config", &config], COMMANDS.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        rules(&out),
        [
            (1, ids(&[])),
            (2, ids(&["git-log-all-refs"])),
            (4, ids(&[])),
            (5, ids(&["git-object-by-hash"])),
            (6, ids(&["no-curl"])),
        ]
    );
    let out = check(&["--config", &config, "--stream", "math"], COMMANDS.as_bytes());
    assert!(rules(&out).iter().all(|(_, r)| r.is_empty()), "{:?}", rules(&out));
    let out = check(&["--config", &config, "--stream", "nope"], b"git status\n");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--stream \"nope\" is not a Stream of") && stderr.contains("swe, math"),
        "{stderr}"
    );
}

/// One exported trajectory whose output (policy version 0) is `output`, after a prompt.
fn trajectory(tokenizer: &Tokenizer, output: &str, recorded: Value) -> String {
    let prompt = tokenizer
        .encode("<|im_start|>user\nFix it<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let out = tokenizer.encode(output).unwrap();
    let n = prompt.len() + out.len();
    let mask: Vec<u8> = (0..n).map(|i| u8::from(i >= prompt.len())).collect();
    let versions: Vec<i64> = (0..n).map(|i| if i >= prompt.len() { 0 } else { -1 }).collect();
    let tokens = [prompt.clone(), out].concat();
    let t = json!({
        "session_id": "s-1", "interaction_id": "i-1", "interaction_ids": ["i-1"],
        "token_ids": tokens, "loss_mask": mask, "logprobs": vec![0.0; n],
        "versions": versions, "prompt_len": prompt.len(), "reward": 1.0, "original_reward": 1.0,
        "finish_reason": "tool_calls", "metadata": {}, "integrity_hits": recorded,
    });
    format!("{t}\n")
}

#[test]
fn exported_trajectories_are_rescanned_with_a_model_or_show_their_recorded_hits() {
    let model = smollm2();
    let tokenizer = Tokenizer::from_model_dir(&model).unwrap();
    let call = "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"git -C /testbed fetch origin\"}}</tool_call>";
    let recorded = json!([{"interaction_id": "i-1", "rule": "git-fetch", "category": "upstream-fetch", "matched": "git fetch origin"}]);
    let input = [
        trajectory(&tokenizer, call, recorded),
        trajectory(&tokenizer, "```bash\ngit reflog\n```", json!([])),
    ]
    .concat();
    let out = check(&[], input.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rules(&out), [(1, ids(&["git-fetch"])), (2, ids(&[]))]);
    let model = model.display().to_string();
    let out = check(&["--model", &model], input.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rules(&out), [(1, ids(&["git-fetch"])), (2, ids(&["git-reflog"]))]);
    let line: Value = serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["source"], "rescanned");
    assert_eq!(line["trajectory"]["interaction_id"], "i-1");
    // A rollouts.jsonl line holds a rollout's trajectories: one output line for all of them.
    let trajectories: Vec<Value> = input.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let record = json!({"key": "0:1:0", "stream": "swe", "trajectories": trajectories});
    for (args, rules_found) in [
        (vec![], ids(&["git-fetch"])),
        (vec!["--model", &model], ids(&["git-fetch", "git-reflog"])),
    ] {
        let out = check(&args, format!("{record}\n").as_bytes());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(rules(&out), [(1, rules_found)]);
        let line: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(line["record"], json!({"key": "0:1:0", "stream": "swe"}));
    }
}

/// The example in docs/integrity-guard.md prints what the binary prints.
#[test]
fn the_documented_example_is_what_the_binary_prints() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/integrity-guard.md"))
            .unwrap();
    let mut lines = doc.lines().skip_while(|l| !l.starts_with("$ printf '"));
    let command = lines.next().expect("the doc has a printf example");
    let input = command
        .strip_prefix("$ printf '")
        .and_then(|c| c.strip_suffix("' | arena-rl guard check"))
        .expect("printf '...' | arena-rl guard check")
        .replace("\\n", "\n");
    let expected: Vec<&str> = lines.take_while(|l| !l.starts_with("```")).collect();
    let out = check(&[], input.as_bytes());
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().collect::<Vec<_>>(),
        expected
    );
}
