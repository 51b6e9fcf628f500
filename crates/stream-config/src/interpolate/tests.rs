//! Interpolation on merged trees.

use figment::value::{Dict, Value};

use super::*;

fn tree(json: serde_json::Value) -> Dict {
    match Value::serialize(json).unwrap() {
        Value::Dict(_, d) => d,
        _ => unreachable!("a JSON object serialises to a dict"),
    }
}

fn resolved(json: serde_json::Value, env: &Env) -> serde_json::Value {
    let d = interpolate(&tree(json), env).unwrap();
    Value::Dict(Tag::Default, d).deserialize().unwrap()
}

fn errors(json: serde_json::Value) -> Vec<String> {
    interpolate(&tree(json), &Env::default())
        .unwrap_err()
        .into_iter()
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect()
}

#[test]
fn env_and_key_references_resolve() {
    let env = Env::from_pairs([("HOST", "h"), ("EMPTY", "")]);
    let out = resolved(
        serde_json::json!({
            "url": "http://${env:HOST}:${port}/${env:MISSING, api}",
            "port": 8080,
            "copy": "${list}",
            "list": [1, "${env:HOST}"],
            "nested": {"deep": "${list.1}-${nested.flag}", "flag": true},
            "empty": "${env:EMPTY,default}",
            "literal": "\\${port}",
        }),
        &env,
    );
    assert_eq!(out["url"], "http://h:8080/api");
    assert_eq!(out["copy"], serde_json::json!([1, "h"]));
    assert_eq!(out["nested"]["deep"], "h-true");
    assert_eq!(out["empty"], "", "a set but empty variable is set");
    assert_eq!(out["literal"], "${port}");
}

#[test]
fn problems_name_the_key_holding_the_reference() {
    insta::assert_snapshot!(errors(serde_json::json!({
        "a": "${b}", "b": "${c.d}", "c": {"d": "${a}"},
        "e": "${env:}", "f": "${not a path}", "g": "x${c}", "h": "${nope.0}",
    })).join("\n"), @r"
    a: reference cycle: a -> b -> c.d -> a
    b: reference cycle: b -> c.d -> a -> b
    c.d: reference cycle: c.d -> a -> b -> c.d
    e: ${env:} names no environment variable
    f: ${not a path} is not a key path such as econfig.timeout or env:NAME
    g: ${c} is not a scalar and cannot be part of a longer string
    h: ${nope.0} refers to the unknown key nope[0]
    ");
}
