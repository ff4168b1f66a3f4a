//! Who may use the API, checked before any handler runs: the `Host` a request names (against DNS
//! rebinding: a web page whose name is made to resolve to 127.0.0.1 still sends its own name),
//! an API key on the `/v1` endpoints (vLLM's `--api-key`: `Authorization: Bearer KEY`), and a
//! JSON content type on the endpoints that read JSON (a page may POST `text/plain` to any
//! address without asking first; a JSON body needs a CORS preflight the server never grants).
//! `/health` and `/metrics` stay open to the key, as in vLLM.

use axum::http::{header, HeaderMap, Method, StatusCode};

/// Hosts a request may name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any `Host` (a server bound to a public address).
    #[default]
    Any,
    /// These names or addresses, without port, lowercase (IPv6 without brackets).
    Only(Vec<String>),
}

impl AllowedHosts {
    /// The loopback names: what a server bound to a loopback address is reached by.
    pub fn loopback() -> AllowedHosts {
        AllowedHosts::Only(vec!["localhost".into(), "127.0.0.1".into(), "::1".into()])
    }

    /// The default for a server bound to `bind` (the `--host` value): the loopback names and
    /// the bound address itself when it is a loopback address or name, else any.
    pub fn for_bind(bind: &str) -> AllowedHosts {
        let b = bind.trim_start_matches('[').trim_end_matches(']');
        let loopback = b.eq_ignore_ascii_case("localhost")
            || b.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        match AllowedHosts::loopback() {
            AllowedHosts::Only(mut names) if loopback => {
                let b = b.to_ascii_lowercase();
                if !names.contains(&b) {
                    names.push(b);
                }
                AllowedHosts::Only(names)
            }
            _ => AllowedHosts::Any,
        }
    }

    /// A comma-separated list (`--allowed-hosts`); `*` allows any.
    pub fn parse(list: &str) -> Result<AllowedHosts, String> {
        let names: Vec<String> = list
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        if names.is_empty() {
            return Err(format!(
                "--allowed-hosts '{list}': give host names or addresses, comma-separated, or *"
            ));
        }
        if names.iter().any(|h| h == "*") {
            return Ok(AllowedHosts::Any);
        }
        Ok(AllowedHosts::Only(
            names.iter().map(|h| host_name(h).to_string()).collect(),
        ))
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            AllowedHosts::Any => true,
            AllowedHosts::Only(names) => {
                let h = host_name(host).to_ascii_lowercase();
                names.contains(&h)
            }
        }
    }
}

impl std::fmt::Display for AllowedHosts {
    /// `any host`, or the names, comma-separated.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllowedHosts::Any => f.write_str("any host"),
            AllowedHosts::Only(names) => f.write_str(&names.join(", ")),
        }
    }
}

/// The name of a `Host` value without its port and a final dot: `a.:80` -> `a`, `[::1]:80` ->
/// `::1`. A bracketed address followed by anything but a port is returned whole (and matches
/// no name).
fn host_name(host: &str) -> &str {
    let host = host.trim();
    let is_port = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((addr, "")) => addr,
            Some((addr, tail)) if tail.strip_prefix(':').is_some_and(is_port) => addr,
            _ => host,
        };
    }
    let name = match host.rsplit_once(':') {
        // A bare IPv6 address has more than one colon and no port.
        Some((name, port)) if !name.contains(':') && is_port(port) => name,
        _ => host,
    };
    name.strip_suffix('.').unwrap_or(name)
}

/// What the checks let through. The default is open: any host, no key (the content type is
/// checked whatever the access).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub hosts: AllowedHosts,
    /// The key `/v1` requests must carry as `Authorization: Bearer KEY`; `None`: no key.
    pub api_key: Option<String>,
}

/// Why a request is refused: status and message.
pub type Refusal = (StatusCode, String);

/// The paths whose `POST` bodies are JSON.
const JSON_PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

impl Access {
    /// Checks one request; `Err` is the answer to give instead of running it.
    pub fn check(&self, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
        // A header's text; "" when absent or not visible ASCII.
        let text = |name| {
            headers
                .get(name)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
        };
        let host = text(header::HOST);
        if !self.hosts.allows(host) {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "Host '{host}' is not allowed: this server answers to {} (--allowed-hosts)",
                    self.hosts
                ),
            ));
        }
        if let Some(key) = &self.api_key {
            if path == "/v1" || path.starts_with("/v1/") {
                let given = text(header::AUTHORIZATION)
                    .strip_prefix("Bearer ")
                    .unwrap_or("");
                if !same_bytes(given.as_bytes(), key.as_bytes()) {
                    return Err((
                        StatusCode::UNAUTHORIZED,
                        "Unauthorized: give the server's API key as 'Authorization: Bearer KEY'"
                            .into(),
                    ));
                }
            }
        }
        if method == Method::POST && JSON_PATHS.contains(&path) {
            let ctype = text(header::CONTENT_TYPE);
            let essence = ctype.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "Content-Type '{ctype}' is not supported: send the body as \
                         application/json"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Equal bytes, compared in time that depends on the lengths only (a key is not guessed byte
/// by byte from the answer's timing).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &y) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn host_names_drop_their_port() {
        assert_eq!(host_name("localhost:8000"), "localhost");
        assert_eq!(host_name("[::1]:8000"), "::1");
        assert_eq!(host_name("::1"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        assert_eq!(host_name("localhost.:80"), "localhost");
        assert_eq!(host_name("[::1]evil"), "[::1]evil");
        assert_eq!(host_name("[::1]:8x"), "[::1]:8x");
        // Another loopback address answers to itself too.
        assert!(AllowedHosts::for_bind("127.0.0.2").allows("127.0.0.2:8000"));
    }

    #[test]
    fn loopback_binds_answer_loopback_names_only() {
        assert_eq!(
            AllowedHosts::for_bind("127.0.0.1"),
            AllowedHosts::loopback()
        );
        assert_eq!(AllowedHosts::for_bind("::1"), AllowedHosts::loopback());
        assert_eq!(AllowedHosts::for_bind("[::1]"), AllowedHosts::loopback());
        assert_eq!(
            AllowedHosts::for_bind("LOCALHOST"),
            AllowedHosts::loopback()
        );
        assert_eq!(AllowedHosts::for_bind("0.0.0.0"), AllowedHosts::Any);
        assert_eq!(AllowedHosts::for_bind("10.1.2.3"), AllowedHosts::Any);
        let l = AllowedHosts::loopback();
        assert!(l.allows("127.0.0.1:8000") && l.allows("LocalHost:1") && l.allows("[::1]:9"));
        assert!(!l.allows("rebind.example:8000") && !l.allows("") && !l.allows("[::1]@x"));
        assert_eq!(
            AllowedHosts::parse(" a.example, * ").unwrap(),
            AllowedHosts::Any
        );
        let p = AllowedHosts::parse("Gw.Example:443,10.0.0.1").unwrap();
        assert!(p.allows("gw.example") && p.allows("10.0.0.1:8000") && !p.allows("x"));
        assert!(AllowedHosts::parse(" , ")
            .unwrap_err()
            .contains("--allowed-hosts"));
    }

    #[test]
    fn the_key_guards_v1_and_leaves_health_and_metrics_open() {
        let a = Access {
            hosts: AllowedHosts::Any,
            api_key: Some("s3cret".into()),
        };
        let json = (header::CONTENT_TYPE, "application/json");
        let post = |path: &str, h: &[(header::HeaderName, &str)]| {
            a.check(&Method::POST, path, &headers(h)).map_err(|e| e.0)
        };
        assert_eq!(
            post("/v1/completions", std::slice::from_ref(&json)),
            Err(StatusCode::UNAUTHORIZED)
        );
        let auth = (header::AUTHORIZATION, "Bearer s3cret");
        assert_eq!(
            post("/v1/completions", &[json.clone(), auth.clone()]),
            Ok(())
        );
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "s3cret", "Basic s3cret"] {
            let h = [json.clone(), (header::AUTHORIZATION, wrong)];
            assert_eq!(post("/v1/completions", &h), Err(StatusCode::UNAUTHORIZED));
        }
        let get = |path: &str| {
            a.check(&Method::GET, path, &HeaderMap::new())
                .map_err(|e| e.0)
        };
        assert_eq!(get("/v1/models"), Err(StatusCode::UNAUTHORIZED));
        assert_eq!(get("/health"), Ok(()));
        assert_eq!(get("/metrics"), Ok(()));
    }

    #[test]
    fn json_endpoints_refuse_other_content_types() {
        let a = Access::default();
        let post = |ctype: Option<&str>| {
            let h = match ctype {
                Some(c) => headers(&[(header::CONTENT_TYPE, c)]),
                None => HeaderMap::new(),
            };
            a.check(&Method::POST, "/v1/chat/completions", &h)
                .map_err(|e| e.0)
        };
        assert_eq!(post(Some("application/json")), Ok(()));
        assert_eq!(post(Some("Application/JSON; charset=utf-8")), Ok(()));
        for bad in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            assert_eq!(
                post(bad),
                Err(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{bad:?}"
            );
        }
        // Other paths and methods are not JSON bodies.
        assert_eq!(
            a.check(&Method::GET, "/v1/models", &HeaderMap::new()),
            Ok(())
        );
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"ab", b"abc") && !same_bytes(b"abcd", b"abc"));
        assert!(!same_bytes(b"abd", b"abc") && !same_bytes(b"", b"a"));
        assert!(same_bytes(b"", b""));
    }
}
