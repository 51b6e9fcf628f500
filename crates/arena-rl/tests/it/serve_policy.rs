//! Two real `arena-rl serve-policy` processes on loopback, behind an API key, as one `EnginePool`: a weight
//! update pauses both (retract), loads new weights from disk on both, confirms the version on both and
//! continues them, while a generation runs across it with exact per-token versions; a server that is gone
//! is left out of the next update, and the other serves at the new version.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use futures::StreamExt;
use rollout_proxy::{
    EngineEvent, EnginePool, GenerateRequest, InferenceEngine, PauseMode, SamplingParams, SglangConfig,
    SglangEngine, WeightUpdate,
};
use secrecy::SecretString;
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{Architecture, ModelConfig, SaveDtype, Weights, save_pretrained};

const KEY: &str = "policy-key-for-tests";

/// A `serve-policy` process, killed when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(model: &std::path::Path) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args([
            "serve-policy",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--port",
            "0",
        ])
        .env("ARENA_RL_POLICY_API_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting serve-policy");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout);
    let mut line = String::new();
    lines.read_line(&mut line).expect("a first line");
    // It listens before it loads the model.
    let url = line
        .strip_prefix("policy server listening on ")
        .and_then(|rest| rest.strip_suffix(" (loading the model)\n"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    // The server goes on writing (once loaded); keep reading, as a launcher's log would.
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    Served { child, url }
}

async fn client(url: &str, key: Option<&str>) -> Result<Arc<SglangEngine>, rollout_proxy::EngineError> {
    let mut config = SglangConfig::new(url);
    config.api_key = key.map(|k| SecretString::from(k.to_string()));
    config.pause_mode = PauseMode::Retract;
    SglangEngine::connect(config).await.map(Arc::new)
}

#[tokio::test]
async fn two_policy_servers_update_under_pause_and_agree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = dir.path().join("step-0");
    crate::model::tiny_model(&first);
    let next = dir.path().join("step-1");
    let config = {
        let mut c = ModelConfig::new(Architecture::Qwen3, 40, 16, 24, 1, 2, 1);
        c.head_dim = 8;
        c
    };
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.3, 4, &Default::default()));
    save_pretrained(&next, &config, &weights, SaveDtype::F32, None).expect("saving the next weights");

    let (a, mut b) = (serve(&first), serve(&first));
    let keyless = client(&a.url, None).await.expect_err("the key is required");
    assert!(keyless.to_string().contains("401"), "{keyless}");
    let (ca, cb) = (
        client(&a.url, Some(KEY)).await.expect("connects"),
        client(&b.url, Some(KEY)).await.expect("connects"),
    );
    assert_eq!(
        ca.max_context_len(),
        4095,
        "the model's 4096 positions, less SGLang's reserved token"
    );
    let pool = EnginePool::new(
        vec![
            (a.url.clone(), ca.clone() as Arc<dyn InferenceEngine>),
            (b.url.clone(), cb.clone() as Arc<dyn InferenceEngine>),
        ],
        PauseMode::Retract,
    );
    let mut running = pool.generate(GenerateRequest {
        input_ids: vec![1, 2, 3].into(),
        sampling: SamplingParams {
            max_new_tokens: 3000,
            ..SamplingParams::default()
        },
        images: Vec::new(),
        affinity: None,
    });
    let mut versions = Vec::new();
    match running.next().await {
        Some(Ok(EngineEvent::Token(t))) => versions.push(t.version),
        other => panic!("expected a first token, got {other:?}"),
    }
    pool.update_weights_from_disk(WeightUpdate {
        path: next.clone(),
        version: Some(1),
    })
    .await
    .expect("both servers agree on version 1");
    for engine in [&ca, &cb] {
        assert_eq!(engine.weight_version().await.expect("asks"), 1);
    }
    while let Some(event) = running.next().await {
        match event.expect("no error") {
            EngineEvent::Token(t) => versions.push(t.version),
            EngineEvent::Finished(_) => break,
        }
    }
    assert_eq!(versions.len(), 3000);
    let cut = versions
        .iter()
        .position(|v| *v == 1)
        .expect("tokens sampled after the update carry version 1");
    assert!(cut >= 1 && versions[..cut].iter().all(|v| *v == 0) && versions[cut..].iter().all(|v| *v == 1));

    // A server that is gone is left out of the next update; the other is updated and serves everything.
    let _ = b.child.kill();
    let _ = b.child.wait();
    pool.update_weights_from_disk(WeightUpdate {
        path: first,
        version: Some(2),
    })
    .await
    .expect("the live server updates without the dead one");
    assert_eq!(ca.weight_version().await.expect("asks"), 2);
    for key in ["k1", "k2"] {
        let mut s = pool.generate(GenerateRequest {
            input_ids: vec![4, 5].into(),
            sampling: SamplingParams {
                max_new_tokens: 4,
                ..SamplingParams::default()
            },
            images: Vec::new(),
            affinity: Some(key.into()),
        });
        while let Some(event) = s.next().await {
            match event.expect("served by the live server") {
                EngineEvent::Token(t) => assert_eq!(t.version, 2),
                EngineEvent::Finished(_) => break,
            }
        }
        assert_eq!(pool.server_of(key), Some(0));
    }
}
