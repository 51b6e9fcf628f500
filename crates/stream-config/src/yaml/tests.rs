//! YAML parsing: locations of key paths, scalars, and errors.

use super::*;

#[test]
fn locations_of_keys_and_items_are_recorded() {
    let text = "a: 1\nb:\n  c: [x, y]\n  d:\n    - e: 2\n";
    let (node, lines) = parse(text).unwrap();
    let at = |p: KeyPath| lines.get(&p).map(|l| (l.line, l.column));
    assert_eq!(at(KeyPath::keys(["a"])), Some((1, 1)));
    assert_eq!(at(KeyPath::keys(["b", "c"])), Some((3, 3)));
    assert_eq!(at(KeyPath::keys(["b", "c"]).index(1)), Some((3, 10)));
    assert_eq!(at(KeyPath::keys(["b", "d"]).index(0).key("e")), Some((5, 7)));
    assert_eq!(
        lines
            .locate(&KeyPath::keys(["b", "c", "missing"]))
            .map(|l| l.line),
        Some(3),
        "an unknown path falls back to its closest ancestor"
    );
    assert!(matches!(node, Node::Map(ref entries) if entries.len() == 2));
}

#[test]
fn scalars_keep_their_yaml_types() {
    let (node, _) =
        parse("i: -3\nu: 18446744073709551615\nf: 0.98\nb: true\nn: ~\ns: '12'\ninf: .inf\n1: numeric key\n")
            .unwrap();
    let json = node.to_json();
    assert_eq!(json["i"], -3);
    assert_eq!(json["u"], 18446744073709551615u64);
    assert_eq!(json["f"], 0.98);
    assert_eq!(json["b"], true);
    assert!(json["n"].is_null());
    assert_eq!(json["s"], "12");
    assert_eq!(json["inf"], ".inf", "non-finite floats stay visible");
    assert_eq!(json["1"], "numeric key");
}

#[test]
fn syntax_errors_carry_a_location_and_one_line() {
    let e = parse("a: 1\nb: [1, 2\n").unwrap_err();
    assert!(e.at.is_some());
    assert!(!e.message.contains('\n'), "{}", e.message);
    let e = parse("a: 1\na: 2\n").unwrap_err();
    assert!(e.message.to_lowercase().contains("duplicate"), "{}", e.message);
    assert_eq!(parse("  \n").unwrap().0, Node::Null);
}

#[test]
fn key_paths_near_a_line_follow_indentation() {
    let text = "a: 1\nb:\n  # comment\n  c:\n    - name: x\n      bad: [1\n  d: 2\n";
    assert_eq!(key_path_near(text, 6).as_deref(), Some("b.c.bad"));
    assert_eq!(key_path_near(text, 5).as_deref(), Some("b.c.name"));
    assert_eq!(key_path_near(text, 7).as_deref(), Some("b.d"));
    assert_eq!(key_path_near(text, 1).as_deref(), Some("a"));
    assert_eq!(key_path_near(text, 99).as_deref(), Some("b.d"));
    assert_eq!(key_path_near("[1, 2", 1), None);
}
