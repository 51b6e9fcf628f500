//! Which temperature, top-p and top-k each generation is sampled at, and what the export records: the
//! real `openai` and `anthropic` SDKs sending temperatures 0.6, 1.0 and 1.3 over all three protocols, the
//! run's defaults filling what a request omits, `override` replacing what a harness sends, and a `concat`
//! export that spans turns sampled at different temperatures. The fake engine's request log says what the
//! engine was asked for; the export must say the same, token by token.

use std::sync::Arc;

use http::StatusCode;
use rollout_proxy::{
    ExportedTrajectory, FakeEngine, HarnessSampling, InferenceEngine, ProxyConfig, ProxyState,
    SamplingDefaults,
};
use serde_json::{Value, json};

use crate::common::{Proxy, config, engine_config, model, python, turn};

const PROTOCOLS: [&str; 3] = ["chat", "responses", "messages"];

const SCRIPT: &str = r#"
import json, sys, openai, anthropic
base, key, protocol, temps = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
out = []
for i, t in enumerate(temps):
    prompt = f"Question {i}"
    stream = i == len(temps) - 1
    if protocol == "chat":
        c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        r = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": prompt}],
                                      temperature=t, top_p=1, stream=stream)
        text = "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices) if stream \
            else r.choices[0].message.content
    elif protocol == "responses":
        c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        r = c.responses.create(model="smol", input=prompt, temperature=t, top_p=1, stream=stream)
        text = "".join(e.delta for e in r if e.type == "response.output_text.delta") if stream \
            else r.output_text
    else:
        c = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        # The anthropic SDK (2.x) has no sampling parameters any more; harnesses send them as extra body.
        r = c.messages.create(model="smol", max_tokens=64, messages=[{"role": "user", "content": prompt}],
                              extra_body={"temperature": t, "top_p": 1}, stream=stream)
        text = "".join(e.delta.text for e in r if e.type == "content_block_delta" and e.delta.type == "text_delta") \
            if stream else r.content[0].text
    out.append(text)
print(json.dumps(out))
"#;

/// One request of `protocol` with `prompt` and the sampling fields in `extra`; answers the reply's text.
async fn send(p: &Proxy, protocol: &str, key: &str, prompt: &str, extra: Value) -> String {
    let mut body = match protocol {
        "chat" => json!({"messages": [{"role": "user", "content": prompt}]}),
        "responses" => json!({"model": "smol", "input": prompt}),
        _ => json!({"model": "smol", "max_tokens": 64, "messages": [{"role": "user", "content": prompt}]}),
    };
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let r = match protocol {
        "chat" => p.chat(key, body).await,
        "responses" => p.responses(key, body).await,
        _ => p.messages(key, body).await,
    };
    assert_eq!(r.status, StatusCode::OK, "{protocol}: {}", r.text);
    let v = r.json();
    let text = match protocol {
        "chat" => &v["choices"][0]["message"]["content"],
        "responses" => &v["output"][0]["content"][0]["text"],
        _ => &v["content"][0]["text"],
    };
    text.as_str().expect("text").to_string()
}

/// The sampling arrays of `t` on the tokens it trains on, and checks that every other token carries the
/// neutral values.
fn sampled(t: &ExportedTrajectory) -> Vec<(f32, f32, u32, u8)> {
    let n = t.token_ids.len();
    assert_eq!(
        [
            t.temperatures.len(),
            t.top_ps.len(),
            t.top_ks.len(),
            t.truncated.len()
        ],
        [n; 4],
        "one entry per token"
    );
    let mut out = Vec::new();
    for i in 0..n {
        let entry = (t.temperatures[i], t.top_ps[i], t.top_ks[i], t.truncated[i]);
        if t.loss_mask[i] == 1 {
            out.push(entry);
        } else if i < t.prompt_len {
            assert_eq!(entry, (1.0, 1.0, 0, 0), "prompt token {i} is neutral");
        }
    }
    out
}

async fn proxy_with(sampling: SamplingDefaults, mode: HarnessSampling) -> Proxy {
    let mut c: ProxyConfig = config();
    c.sampling = sampling;
    c.harness_sampling = mode;
    Proxy::start(c, engine_config()).await
}

#[tokio::test]
async fn sdk_temperatures_reach_the_engine_and_the_export_in_every_protocol() {
    let temps = [0.6f32, 1.0, 1.3];
    for protocol in PROTOCOLS {
        let p = Proxy::default().await;
        let (session, key) = p.session(protocol).await;
        let answers: Vec<String> = (0..temps.len()).map(|k| format!("answer {k}")).collect();
        for a in &answers {
            p.engine.push_script(turn(a));
        }
        let out = python(SCRIPT, &[&p.url(""), &key, protocol, "[0.6, 1.0, 1.3]"]).await;
        assert_eq!(out, json!(answers), "{protocol}");
        let asked: Vec<(f32, f32, Option<u32>)> = p
            .engine
            .requests()
            .iter()
            .map(|r| (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k))
            .collect();
        assert_eq!(
            asked,
            temps.map(|t| (t, 1.0, None)).to_vec(),
            "{protocol}: the engine is asked for what the SDK sent"
        );
        p.end(&key).await;
        let exported = p.export(&session, "individual").await;
        assert_eq!(exported.trajectories.len(), temps.len(), "{protocol}");
        for (t, (temperature, a)) in exported.trajectories.iter().zip(temps.iter().zip(&answers)) {
            let s = sampled(t);
            assert_eq!(s.len(), turn(a).len(), "{protocol}");
            assert!(
                s.iter().all(|e| *e == (*temperature, 1.0, 0, 0)),
                "{protocol}: every sampled token records temperature {temperature}, untruncated: {s:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_runs_defaults_fill_what_a_request_omits() {
    let run = SamplingDefaults {
        temperature: Some(0.7),
        top_p: Some(0.95),
        top_k: Some(40),
    };
    for protocol in PROTOCOLS {
        let p = proxy_with(run, HarnessSampling::Honour).await;
        let (session, key) = p.session(protocol).await;
        p.engine.push_script(turn("defaults"));
        p.engine.push_script(turn("partly mine"));
        assert_eq!(send(&p, protocol, &key, "a", json!({})).await, "defaults");
        let own = json!({"temperature": 1.3, "top_k": 5});
        assert_eq!(send(&p, protocol, &key, "b", own).await, "partly mine");
        let asked: Vec<(f32, f32, Option<u32>)> = p
            .engine
            .requests()
            .iter()
            .map(|r| (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k))
            .collect();
        assert_eq!(
            asked,
            vec![(0.7, 0.95, Some(40)), (1.3, 0.95, Some(5))],
            "{protocol}"
        );
        p.end(&key).await;
        let exported = p.export(&session, "individual").await;
        let s: Vec<_> = exported.trajectories.iter().map(sampled).collect();
        assert!(
            s[0].iter().all(|e| *e == (0.7, 0.95, 40, 1)),
            "{protocol}: {:?}",
            s[0]
        );
        assert!(
            s[1].iter().all(|e| *e == (1.3, 0.95, 5, 1)),
            "{protocol}: {:?}",
            s[1]
        );
    }
}

#[tokio::test]
async fn session_generation_args_come_before_the_runs_defaults() {
    let run = SamplingDefaults {
        temperature: Some(0.7),
        ..SamplingDefaults::default()
    };
    let p = proxy_with(run, HarnessSampling::Honour).await;
    assert_eq!(p.admin("/grant_capacity", json!({})).await.status, StatusCode::OK);
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "g", "metadata": {"generation_args": {"temperature": 0.5}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let key = r.json()["api_key"].as_str().expect("key").to_string();
    p.engine.push_script(turn("ok"));
    send(&p, "chat", &key, "a", json!({})).await;
    assert_eq!(p.engine.requests()[0].sampling.temperature, 0.5);
}

#[tokio::test]
async fn override_replaces_what_a_harness_sends() {
    let run = SamplingDefaults {
        temperature: Some(0.9),
        ..SamplingDefaults::default()
    };
    for protocol in PROTOCOLS {
        let p = proxy_with(run, HarnessSampling::Override).await;
        let (session, key) = p.session(protocol).await;
        p.engine.push_script(turn("the run decides"));
        let own = json!({"temperature": 0.6, "top_p": 0.5, "top_k": 5});
        send(&p, protocol, &key, "a", own).await;
        let r = &p.engine.requests()[0];
        assert_eq!(
            (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k),
            (0.9, 1.0, None),
            "{protocol}: the run's values, and the fallback where the run sets none"
        );
        p.end(&key).await;
        let exported = p.export(&session, "individual").await;
        let s = sampled(&exported.trajectories[0]);
        assert!(s.iter().all(|e| *e == (0.9, 1.0, 0, 0)), "{protocol}: {s:?}");
    }
}

#[tokio::test]
async fn a_concat_export_carries_each_turns_temperature() {
    let p = Proxy::default().await;
    let (session, key) = p.session("concat").await;
    let mut messages = vec![json!({"role": "user", "content": "first"})];
    let mut lens = Vec::new();
    for (k, extra) in [
        json!({"temperature": 0.6}),
        json!({"temperature": 1.3, "top_p": 0.9}),
        json!({"temperature": 0.0, "top_p": 0.5}),
    ]
    .into_iter()
    .enumerate()
    {
        let text = format!("reply {k}");
        p.engine.push_script(turn(&text));
        lens.push(turn(&text).len());
        let mut body = json!({"messages": messages});
        for (f, v) in extra.as_object().expect("an object") {
            body[f] = v.clone();
        }
        let r = p.chat(&key, body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        messages.push(r.json()["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("next {k}")}));
    }
    p.end(&key).await;
    let exported = p.export(&session, "concat").await;
    assert_eq!(exported.trajectories.len(), 1, "each turn extended the last");
    let s = sampled(&exported.trajectories[0]);
    let mut expect = Vec::new();
    expect.extend(std::iter::repeat_n((0.6, 1.0, 0, 0), lens[0]));
    expect.extend(std::iter::repeat_n((1.3, 0.9, 0, 1), lens[1]));
    // Greedy tokens are recorded at temperature 1 over the whole vocabulary, whatever top-p says.
    expect.extend(std::iter::repeat_n((1.0, 1.0, 0, 0), lens[2]));
    assert_eq!(s, expect);
    let asked: Vec<f32> = p
        .engine
        .requests()
        .iter()
        .map(|r| r.sampling.temperature)
        .collect();
    assert_eq!(asked, vec![0.6, 1.3, 0.0], "the engine was asked for greedy");
}

#[tokio::test]
async fn bad_values_are_refused_by_name_from_the_run_and_from_a_harness() {
    let mut c = config();
    c.sampling.top_p = Some(0.0);
    let engine: Arc<dyn InferenceEngine> = Arc::new(FakeEngine::new(engine_config()));
    let err = ProxyState::new(c, model(), engine).expect_err("refused");
    assert!(err.to_string().contains("sampling.top_p"), "{err}");

    // Under override a harness's nonsense is still its own error.
    let run = SamplingDefaults {
        temperature: Some(0.9),
        ..SamplingDefaults::default()
    };
    let p = proxy_with(run, HarnessSampling::Override).await;
    let (_, key) = p.session("bad").await;
    let r = p
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("temperature"), "{}", r.text);
    assert!(p.engine.requests().is_empty());
}

#[tokio::test]
async fn a_response_object_reports_the_values_it_was_sampled_at() {
    let run = SamplingDefaults {
        temperature: Some(0.9),
        top_p: Some(0.95),
        top_k: None,
    };
    for (mode, sent, expect) in [
        (
            HarnessSampling::Override,
            json!({"temperature": 0.6}),
            json!([0.9, 0.95]),
        ),
        (
            HarnessSampling::Honour,
            json!({"temperature": 0.6}),
            json!([0.6, 0.95]),
        ),
    ] {
        let p = proxy_with(run, mode).await;
        let (_, key) = p.session("echo").await;
        p.engine.push_script(turn("ok"));
        let mut body = json!({"model": "smol", "input": "hi"});
        body["temperature"] = sent["temperature"].clone();
        let r = p.responses(&key, body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let v = r.json();
        assert_eq!(json!([v["temperature"], v["top_p"]]), expect, "{mode:?}");
    }
}
