//! Whether Arena can reach the proxy: the address the proxy advertises, the refusal of a loopback or
//! unspecified address when Arena is on another host, and the end-to-end check through Arena's gateway
//! before the first launch.
//!
//! A proxy bound to every interface (`proxy.host: 0.0.0.0`) advertises the address of the interface that
//! routes to `econfig.arena_base_url` (the source address the kernel picks for it), not the locally
//! resolved hostname, which Debian maps to 127.0.1.1. `proxy.public_url` overrides it.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _, UdpSocket};
use std::time::Duration;

use arena_client::{ArenaClient, RouteCheck};
use secrecy::SecretString;
use stream_config::RunConfig;

use crate::error::{Error, Result};
use crate::proxy_control::ProxyControl;

#[cfg(test)]
mod tests;

/// Where Arena is, as seen from here, and what the proxy will advertise to it.
#[derive(Debug, Clone)]
pub(crate) struct Reach {
    /// Every address Arena's base URL resolves to is on loopback: Arena runs on this host.
    arena_local: bool,
    /// The address the proxy advertises when it listens on every interface and `proxy.public_url` is
    /// unset: the source address of the route to Arena.
    route_source: Option<IpAddr>,
}

/// `host:port` of `url`, resolved; empty when it does not parse or resolve (the Arena client reports that).
fn resolve(url: &str) -> Vec<SocketAddr> {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return Vec::new();
    };
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return Vec::new();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default()
}

/// The local address the kernel would send from to reach `to` (a UDP `connect` sends nothing).
fn route_source(to: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any)?;
    socket.connect(to)?;
    Ok(socket.local_addr()?.ip())
}

fn unreachable_ip(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified()
}

/// Decides what the proxy advertises and refuses, before anything starts, a loopback or unspecified address
/// when Arena is not on this host.
pub(crate) fn plan(config: &RunConfig) -> Result<Reach> {
    let base = config.econfig.arena_base_url.trim();
    let arena = resolve(base);
    let arena_local = !arena.is_empty() && arena.iter().all(|a| a.ip().is_loopback());
    let public_url = config.proxy.public_url.trim();
    let host: Option<IpAddr> = config.proxy.host.parse().ok();
    let mut route_source_ip = None;
    let advertised: Option<(String, bool)> = if !public_url.is_empty() {
        let addrs = resolve(public_url);
        let bad = addrs.is_empty() || addrs.iter().any(|a| unreachable_ip(a.ip()));
        Some((public_url.to_string(), bad))
    } else {
        match host {
            Some(ip) if ip.is_unspecified() => match arena.first() {
                Some(to) => {
                    let source = route_source(*to).map_err(|e| {
                        Error::Invalid(format!(
                            "no interface of this host routes to Arena at {base} ({e}); set proxy.public_url \
                             to an address Arena can reach"
                        ))
                    })?;
                    route_source_ip = Some(source);
                    Some((source.to_string(), unreachable_ip(source)))
                }
                None => None,
            },
            Some(ip) => Some((ip.to_string(), unreachable_ip(ip))),
            None => None,
        }
    };
    if let Some((what, true)) = advertised
        && !arena_local
        && !arena.is_empty()
    {
        return Err(Error::Invalid(format!(
            "the proxy would advertise {what} to Arena at {base}, which is on another host and cannot reach it: \
             set proxy.host to 0.0.0.0 (the address of the interface that routes to Arena is advertised) or \
             proxy.public_url to an address Arena can reach (proxy.host is {:?}, proxy.public_url is {:?})",
            config.proxy.host, config.proxy.public_url
        )));
    }
    Ok(Reach {
        arena_local,
        route_source: route_source_ip,
    })
}

impl Reach {
    /// The URL the proxy advertises, given the address it is bound to and `proxy.public_url`.
    pub(crate) fn public_url(&self, config: &RunConfig, bound: SocketAddr) -> String {
        if !config.proxy.public_url.trim().is_empty() {
            return config.proxy.public_url.trim().trim_end_matches('/').to_string();
        }
        let ip = if bound.ip().is_unspecified() {
            self.route_source.unwrap_or(bound.ip())
        } else {
            bound.ip()
        };
        if ip.is_unspecified() {
            // Arena's address did not resolve here; the hostname is the best guess left.
            return format!("http://{}:{}", crate::observe::hostname(), bound.port());
        }
        format!("http://{}", SocketAddr::new(ip, bound.port()))
    }

    /// Before the first launch, when Arena is on another host: non-loopback is not the same as reachable,
    /// so one request goes through Arena's gateway to the proxy ([`check_route`]). Without the gateway key
    /// there is no gateway to go through, and the check is skipped with a warning.
    pub(crate) async fn check(
        &self,
        client: &ArenaClient,
        env: &stream_config::Env,
        control: &ProxyControl,
        public_url: &str,
    ) -> Result<()> {
        if self.arena_local {
            return Ok(());
        }
        match arena_client::llm_api_key(env) {
            Ok(key) => check_route(client, control, public_url, &key).await,
            Err(_) => {
                tracing::warn!(
                    proxy = public_url,
                    "ARENA_LLM_API_KEY is not set, so the route from Arena's gateway to the proxy is not checked"
                );
                Ok(())
            }
        }
    }
}

/// How long each call of the route check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// One request through Arena's gateway to the proxy ([`ArenaClient::check_route`]) under a probe session
/// whose key the temporary route presents; the session is ended and forgotten whatever the outcome. An Arena
/// that does not offer route registration is not checked, with a warning.
async fn check_route(
    client: &ArenaClient,
    control: &ProxyControl,
    public_url: &str,
    llm_api_key: &SecretString,
) -> Result<()> {
    let refused = |e: String| Error::Invalid(format!("route check: the proxy refused a probe session: {e}"));
    control.grant().await.map_err(|e| refused(e.to_string()))?;
    let session = control
        .start("arena-rl-route-check")
        .await
        .map_err(|e| refused(e.to_string()))?;
    let checked = client
        .check_route(public_url, &session.api_key, llm_api_key, CHECK_TIMEOUT)
        .await;
    if let Err(e) = control.end(&session.session_id).await {
        tracing::warn!(error = %e, "route check: ending the probe session failed");
    }
    let _ = control
        .export(
            &session.session_id,
            rollout_proxy::ExportStyle::Individual,
            1.0,
            None,
            None,
        )
        .await;
    match checked {
        Ok(RouteCheck::Reached) => {
            tracing::info!(
                proxy = public_url,
                "route check: Arena's gateway reaches the proxy"
            );
            Ok(())
        }
        Ok(RouteCheck::NotOffered) => {
            tracing::warn!(
                proxy = public_url,
                "Arena does not offer LLM route registration, so the route from Arena to the proxy is not checked"
            );
            Ok(())
        }
        Ok(RouteCheck::Failed(why)) => Err(Error::Invalid(format!(
            "route check: Arena's gateway could not reach the proxy at {public_url} ({why}); set \
             proxy.public_url (or proxy.host) to an address Arena can reach"
        ))),
        Err(e) => Err(Error::Invalid(format!(
            "route check: registering a probe route to {public_url} failed: {e}"
        ))),
    }
}
