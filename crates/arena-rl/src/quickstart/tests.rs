//! The quickstart's own helpers: curve ends, the embedded config and fresh trial names.

use super::*;

#[test]
fn curve_ends_average_the_first_and_last_windows_by_step() {
    let rewards: Vec<(u64, f64)> = (0..25).rev().map(|s| (s, s as f64)).collect();
    let (first, last) = curve_ends(&rewards, 10);
    assert_eq!(first, Some((4.5, 10)));
    assert_eq!(last, Some((19.5, 10)));
    let (first, last) = curve_ends(&[(0, 0.25), (1, 0.75)], 10);
    assert_eq!(first, Some((0.5, 2)));
    assert_eq!(last, Some((0.5, 2)));
    assert_eq!(curve_ends(&[], 10), (None, None));
}

#[test]
fn the_embedded_config_loads_with_a_fresh_trial_unless_one_is_named() {
    let env = Env::from_pairs::<&str, &str>([]);
    let fresh = load_config(&[], true, &env).unwrap();
    let stamp = fresh.trial_name.strip_prefix("local-").unwrap();
    assert_eq!(stamp.len(), "20250101-000000".len(), "{stamp}");
    assert!(stamp[..8].chars().all(|c| c.is_ascii_digit()) && &stamp[8..9] == "-");
    assert_eq!(
        fresh.econfig.arena_llm_route_mode,
        stream_config::RouteMode::SessionGateway
    );
    assert_eq!(fresh.econfig.arena_streams.len(), 2);
    assert!(
        fresh
            .econfig
            .arena_result_dump_dir
            .ends_with(&format!("/{}/arena_results", fresh.trial_name)),
        "{}",
        fresh.econfig.arena_result_dump_dir
    );
    let named = load_config(&["trial_name=mine".to_string()], true, &env).unwrap();
    assert_eq!(named.trial_name, "mine");
    let plain = load_config(&[], false, &env).unwrap();
    assert_eq!(plain.trial_name, "local");
}
