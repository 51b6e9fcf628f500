//! What the proxy advertises and refuses, for Arena on loopback and on another host (192.0.2.0/24 is
//! TEST-NET-1: an address nothing answers, which needs no network to decide on).

use std::net::SocketAddr;

use stream_config::RunConfig;

use super::plan;

fn config(arena: &str, host: &str, public_url: &str) -> RunConfig {
    let mut c = RunConfig::default();
    c.econfig.arena_base_url = arena.to_string();
    c.proxy.host = host.to_string();
    c.proxy.public_url = public_url.to_string();
    c
}

/// `Ok(advertised URL for a proxy bound to host:8080)` or the refusal's text.
fn check(arena: &str, host: &str, public_url: &str) -> Result<String, String> {
    let c = config(arena, host, public_url);
    let reach = plan(&c).map_err(|e| e.to_string())?;
    let bound: SocketAddr = format!("{host}:8080").parse().expect("an address");
    Ok(reach.public_url(&c, bound))
}

#[test]
fn loopback_is_refused_when_arena_is_elsewhere_and_fine_when_it_is_here() {
    assert_eq!(
        check("http://127.0.0.1:9000", "127.0.0.1", "").as_deref(),
        Ok("http://127.0.0.1:8080")
    );
    assert_eq!(
        check("http://127.0.0.1:9000", "0.0.0.0", "").as_deref(),
        Ok("http://127.0.0.1:8080"),
        "every interface, Arena on loopback: the route to Arena leaves from loopback"
    );
    for (host, public_url, shown) in [
        ("127.0.0.1", "", "127.0.0.1"),
        ("0.0.0.0", "http://localhost:8080", "http://localhost:8080"),
        ("0.0.0.0", "http://127.0.1.1:8080", "http://127.0.1.1:8080"),
    ] {
        let refused = check("http://192.0.2.7:9000", host, public_url).expect_err("refused");
        assert!(
            refused.contains(&format!("advertise {shown} to Arena at http://192.0.2.7:9000"))
                && refused.contains("proxy.host")
                && refused.contains("proxy.public_url")
                && !refused.contains('\n'),
            "{refused}"
        );
    }
}

#[test]
fn public_url_overrides_what_is_advertised() {
    assert_eq!(
        check("http://192.0.2.7:9000", "0.0.0.0", "http://192.0.2.1:7000/").as_deref(),
        Ok("http://192.0.2.1:7000")
    );
    assert_eq!(
        check("http://192.0.2.7:9000", "192.0.2.3", "").as_deref(),
        Ok("http://192.0.2.3:8080")
    );
}
