//! An HTTPS server whose certificate rotates without a restart.
//!
//! ```text
//! serve [--listen ADDR] [--cert PATH --key PATH [--ca PATH]]
//!       [--cert-dir DIR] [--poll DURATION] [--no-notify]
//!       [--name NAME]... [--self-signed-validity DURATION]
//!       [--self-signed-dir DIR] [--self-signed-ca]
//!       [--k8s-secret NAMESPACE/NAME]
//!       [--k8s-shared NAMESPACE/NAME [--lease NAME] [--identity ID]]
//!       [--seal-key PATH]... [--seal-adopt-unsealed] [--seal-served-key]
//!       [--sni NAME=DIR]... [--sni-strict]
//!       [--k8s-secrets NAMESPACE [--selector SELECTOR]]
//!       [--ready-before-lists]
//!       [--ready-timeout DURATION] [--fail-fast]
//!       [--handshake-timeout DURATION] [--recycle-after DURATION]
//!       [--client-ca PATH [--ca-overlap DURATION]]
//!       [--metrics ADDR]
//!       [--acme-directory URL[,ca=PATH][,eab-kid=ID,eab-key-file=PATH]...
//!        --acme-domain NAME... --acme-state DIR
//!        [--acme-email ADDR] [--acme-directory-ca PATH]
//!        [--acme-challenge tls-alpn-01|http-01 [--acme-http-listen ADDR]]
//!        [--acme-challenge dns-01 --acme-dns-server HOST:PORT --acme-dns-tsig-key FILE]
//!        [--acme-eab-kid ID --acme-eab-key B64URL]
//!        [--acme-weekly-limit N]
//!        [--acme-profile NAME | --acme-profile-required NAME]]
//!       [--session-tickets fleet|FILE|off [--ticket-rotation DURATION] | --no-resumption]
//!       [--etcd ENDPOINTS [--etcd-prefix PREFIX] [--etcd-cert NAME] [--etcd-certs]
//!        [--etcd-shared NAME [--identity ID] [--etcd-lease-ttl DURATION]]
//!        [--etcd-user USER --etcd-password-file PATH]
//!        [--etcd-ca PATH [--etcd-client-cert PATH --etcd-client-key PATH]]]
//!       [--upstream ADDR [--request-timeout DURATION] [--max-request-body SIZE]
//!        | --upstream-tcp ADDR [--proxy-protocol]] [--idle-timeout DURATION]
//!       [--status-listen ADDR]
//!       [--allow-cn NAME]... [--allow-dns NAME]... [--allow-uri URI]... [--allow-file PATH]
//!
//! serve [certificate flags] --connect HOST:PORT --client-listen ADDR
//!       [--connect-ca PATH] [--connect-sni NAME] [--status-listen ADDR]
//! ```
//!
//! - With no certificate flags it serves a self-signed certificate for `localhost`, `127.0.0.1`,
//!   `::1` and each `--name`, renewed when a third of its validity (default 90 days) remains:
//!   nothing to set up. `--self-signed-dir` keeps it across restarts; `--self-signed-ca` signs
//!   the leaves with a stable CA (shown in the status) that clients can trust.
//! - `--cert-dir DIR` reads the `kubernetes.io/tls` layout: `DIR/tls.crt`, `DIR/tls.key`, and
//!   `DIR/ca.crt` when present. Try it with `cargo run --example rotate -- DIR`.
//! - `--k8s-secret NAMESPACE/NAME` watches a `kubernetes.io/tls` Secret through the API (the
//!   ambient kubeconfig, or the in-cluster config): new data is served milliseconds after it is
//!   written.
//! - `--k8s-shared NAMESPACE/NAME` runs the replicas of a fleet on one self-signed certificate:
//!   every replica serves the Secret `NAME`; the holder of the Lease `--lease` (default
//!   `NAME-writer`) creates and renews it, reusing it while it fits, through fenced writes. The
//!   self-signed flags (`--name`, `--self-signed-validity`, `--self-signed-ca`) apply to what
//!   the leader generates; with `--self-signed-ca` the CA's key is kept in the Secret
//!   `NAME-ca`. `--identity` names this replica (default: `POD_NAME`, then the host name). The
//!   status JSON gains `leader`: `{"holder": …, "round": …, "leading": true|false}`.
//! - `--seal-key PATH` (repeatable; with `--k8s-shared`) seals the fleet's own state, the CA
//!   Secret, with the key in `PATH` (32 random bytes in base64: `openssl rand -base64 32`;
//!   re-read when it changes): the first key seals, all open. A replica that cannot open what
//!   is stored serves, writes nothing and does not lead. Unsealed state is refused unless
//!   `--seal-adopt-unsealed` (once, to migrate); `--seal-served-key` seals the served Secret's
//!   `tls.key` too (with `--k8s-secret`, `--seal-key` opens one). The status JSON gains
//!   `seal`: `{"key_ids": […], "state": "open"|"refused"|"unknown", "reason": …}`. With
//!   `--acme-directory` and `--k8s-shared`, `--seal-key` seals the ACME account and the keys of
//!   orders in flight (a replica that cannot open them says so in `acme.account_error`);
//!   `--seal-served-key` is refused there (the certificates' Secrets are served by a
//!   label-selector watch that reads plain `tls.key`s).
//! - `--sni NAME=DIR` (repeatable) serves the certificate in the kubelet-style directory `DIR`
//!   to handshakes for `NAME` (exact, or a wildcard such as `*.example.com`); the certificate the
//!   other flags choose is the default, for every other name. `--sni-strict` refuses other names.
//!   A handshake without a server name (a client connecting to an IP address sends none) is
//!   served the certificate for the IP address it arrived on, if a route (`--sni 192.0.2.7=DIR`,
//!   a Secret, `--acme-domain 192.0.2.7`) has one or the default covers it, else the routes'
//!   one IP certificate if there is exactly one, else the default (refused under
//!   `--sni-strict`).
//! - `--k8s-secrets NAMESPACE --selector SELECTOR` serves every `kubernetes.io/tls` Secret
//!   matching the label selector, each for the DNS names in its certificate, through one watch.
//!   Connections are refused until the whole list is in (so no listed name is served the
//!   default, or refused under `--sni-strict`, after a restart); `--ready-before-lists` listens
//!   once the default certificate is in and serves it while the list loads.
//! - `--etcd ENDPOINTS` (comma-separated; every member) reads certificates kept in etcd under
//!   `--etcd-prefix` (default `/tls-rotation/`): `--etcd-cert NAME` serves the one at
//!   `PREFIX/certs/NAME` as the default certificate, `--etcd-certs` every one under
//!   `PREFIX/certs/` as SNI routes by the names in each (listening once the whole prefix is
//!   listed, as for `--k8s-secrets`). A value is JSON shaped like a TLS Secret's data, PEM text
//!   in `tls.crt`, `tls.key` and an optional `ca.crt`. A bad value, a key of another pair or
//!   (for `--etcd-cert`) a deleted key keeps the last good certificate serving; a member that
//!   goes away is left for the next endpoint. `--etcd-ca` is TLS to etcd, with
//!   `--etcd-client-cert` and `--etcd-client-key` (followed like `--cert`) for its
//!   `--client-cert-auth`; `--etcd-user` with `--etcd-password-file` authenticates.
//!   `--etcd-shared NAME` is `--k8s-shared` on etcd: one self-signed certificate (and CA, with
//!   `--self-signed-ca`) for every replica under `PREFIX/fleets/NAME/`, written by the holder of
//!   the writer key `PREFIX/fleets/NAME/writer` (an etcd lease of `--etcd-lease-ttl`, default
//!   15 s; `--identity` names this replica) in transactions fenced by its round; with
//!   `--seal-key` every private key is stored sealed. The status JSON gains `leader` and `seal`
//!   as with `--k8s-shared`. With `--acme-directory`, ACME for a fleet on etcd (below).
//! - `--acme-directory URL` gets a certificate from that ACME CA for each `--acme-domain`
//!   (one each; a DNS name, a wildcard with DNS-01, or an IP address, RFC 8738),
//!   served as its SNI route beside the default (an address's certificate to handshakes
//!   without a server name, as above; with no `--acme-profile`, `shortlived` is asked for
//!   when the CA advertises it, the only profile Let's Encrypt issues addresses under):
//!   TLS-ALPN-01 is answered on `--listen` (the CA's validation gets through before anything
//!   is stored), HTTP-01 with `--acme-challenge http-01` on `--acme-http-listen`, DNS-01 with
//!   `--acme-challenge dns-01` by RFC 2136 update signed with TSIG at `--acme-dns-server`
//!   (the zone's primary) with the key of `--acme-dns-tsig-key` (BIND's format, not
//!   world-readable; see `tls_acme::rfc2136`). The account,
//!   the certificates and the orders in flight are kept in `--acme-state DIR`, so a restart
//!   serves what is stored at once and orders nothing that still fits. `--acme-directory-ca`
//!   trusts a private or test CA for the directory's HTTPS. The status JSON gains `acme`:
//!   `{"directory": …, "account": …, "names": {NAME: {"state": "valid"|"ordering"|"backoff"|
//!   "failed", "not_after": …, "renew_after": …, "renew_reason": "lifetime"|"ari", "ari_next":
//!   …, "retry_at": …, "last_error": …, "decided_at": …, "profile": …, "profile_note": …,
//!   "issuer": …, "fallback_reason": …}}}`, with `account_error` and `account_replaced` when
//!   there is something to say. `--acme-directory` given more than once names more CAs: the
//!   first is preferred (its `,ca=` and `,eab-kid=,eab-key-file=` are `--acme-directory-ca`
//!   and `--acme-eab-*`); an order that fails for a reason of the CA's (down, a 5xx,
//!   `serverInternal`, `rateLimited`) is placed with the next at once, one that fails for the
//!   name's own (a validation, `caa`, `rejectedIdentifier`) is not; `issuer` names the
//!   directory of the CA that issued each certificate and `fallback_reason` why it is not the
//!   first; ARI and `replaces` go to the issuer; every renewal starts with the first again. `--acme-profile NAME` asks the CA for that profile when it offers
//!   it (`--acme-profile-required NAME`: nothing is ordered when it does not).
//!   `--acme-weekly-limit N` caps first orders per registered
//!   domain a week (default 50); SIGHUP retries every failed name as the CA's limits allow. With
//!   `--k8s-shared NAMESPACE/NAME` instead of `--acme-state`, ACME for a fleet: the state in
//!   Secrets `NAME-acme-*`, the Lease holder orders, every replica serves and answers; with
//!   `--etcd-shared NAME`, the same on etcd: the state under `PREFIX/fleets/NAME/acme/`, the
//!   holder of the writer key orders (every write fenced by its round), and with `--seal-key`
//!   every private key there is sealed (the certificates' too: every replica opens them).
//! - `--session-tickets` issues TLS 1.3 session tickets a returning client resumes with on any
//!   replica (off by default: each process its own session cache). `fleet` (with
//!   `--k8s-shared NAMESPACE/NAME`): the Lease holder writes the keys into the Secret
//!   `NAME-tickets` with fenced writes, sealed with `--seal-key`, and every replica reads them;
//!   a replica that cannot read them uses keys of its own (resumption then works only on it)
//!   and says so. `FILE`: keys derived from the 32 or more random bytes (base64) in `FILE`, so
//!   processes given the same file share tickets with no store, and whoever reads the file
//!   opens every period's tickets. Each key is current for `--ticket-rotation` (default 6 h); a
//!   ticket lives at most twice that. TLS 1.2 gets none; 0-RTT stays off. The status JSON
//!   gains `session_tickets`: `{"source": "fleet"|"secret"|"local", "key_id": …,
//!   "key_age_seconds": …, "rotation_seconds": …, "note": …}` (never a key). `--no-resumption`
//!   turns resumption off altogether (no tickets, no session cache): every connection is a
//!   full handshake.
//! - `GET /` answers the reloader's status as JSON, with a `routes` object for the SNI routes.
//! - `--client-ca PATH` requires client certificates (mTLS) signed by a CA in `PATH`, followed
//!   like the certificate files (kubelet-style directories included); a CA that leaves it stays trusted for `--ca-overlap`
//!   (default `0s`), and no session from before can be resumed after. The status JSON then has
//!   `client_ca_fingerprints_sha256`, `client_fingerprint_sha256` (the certificate presented
//!   on the request's connection) and `client_ca_error` (why the CA file was last refused).
//! - `--recycle-after DURATION`: once a newer certificate is installed, connections at least that
//!   old are closed gracefully (HTTP/2 GOAWAY, HTTP/1.1 `Connection: close`), so keep-alive
//!   clients pick it up; off by default.
//! - `--metrics ADDR` serves Prometheus metrics (plain HTTP) at `http://ADDR/metrics`: the
//!   served certificate's expiry per source and route, installs, rejections by reason, source
//!   errors, the last success, readiness, and with `--k8s-shared` the Lease and the fenced
//!   writes (the names are in the `tls-reload` and `tls-k8s` crate docs).
//! - **A sidecar.** `--upstream ADDR` (`HOST:PORT`, or a Unix socket path) proxies every
//!   request to an application instead of answering the status page: HTTP/1.1, gRPC (a
//!   request with `content-type: application/grpc*`) over h2c so its trailers pass, and
//!   WebSocket upgrades. The upstream gets `X-Forwarded-For` (the client's address, replacing
//!   any), `X-Forwarded-Proto: https` and, with a client certificate, `X-Forwarded-Client-Cert`
//!   in Envoy's format (`Hash=…;Subject="…";URI=…;DNS=…`); those, `Forwarded`,
//!   `X-Forwarded-Host`, `X-Forwarded-Port` and hop-by-hop headers sent by the client are never
//!   passed on. Keep the upstream reachable only through serve (loopback or a Unix socket), or
//!   those headers can be forged around it. An upstream that is down gets 502 and a log line,
//!   one that has not answered in `--request-timeout` (default 60 s) 504, a body over
//!   `--max-request-body` (default 16 MiB) 413; a client connection idle for `--idle-timeout`
//!   (default 5 min) is closed gracefully. `--upstream-tcp ADDR` passes each connection's
//!   bytes instead (no ALPN is negotiated), with `--proxy-protocol` after a PROXY protocol v2
//!   header: the client's address, the SNI, the TLS version, the client certificate's common
//!   name (`PP2_SUBTYPE_SSL_CN`) and each of its URI SANs (type `0xE0`); a recycle or a trust
//!   close ends such a connection. `--status-listen ADDR` serves the status page and the
//!   metrics (`/metrics`) over plain HTTP. Rotation, `--recycle-after`, trust closes and the
//!   graceful stop hold for proxied connections.
//! - **Client authorization.** With `--client-ca`, `--allow-cn NAME`, `--allow-dns NAME` and
//!   `--allow-uri URI` (each repeatable) let in only the verified clients one of them matches:
//!   the common name exactly, a DNS SAN exactly, a URI SAN exactly or, for a rule ending in
//!   `/*`, with one or more path segments after it (`spiffe://example.org/ns/prod/*`; a
//!   `spiffe://` rule matches only a certificate with exactly one URI SAN). `--allow-file PATH`
//!   adds the rules in a file, one a line (`cn=…`, `dns=…`, `uri=…`, `#` comments), read again
//!   every `--poll` and on SIGHUP: a change closes the open connections it refuses, a file that
//!   does not parse changes nothing. Any other client is refused in the handshake (the alert
//!   `access_denied`), logged with its identity and counted in
//!   `tls_reload_clients_refused_total`; a resumed session is checked again.
//! - **Outbound mTLS.** `--connect HOST:PORT --client-listen ADDR` makes serve a client: each
//!   plain connection an application makes to `ADDR` is carried to `HOST:PORT` over TLS,
//!   presenting the certificate the source flags choose (`--cert-dir`, `--k8s-secret`, a
//!   self-signed fleet, …, whose leaves then carry clientAuth; each new connection presents the
//!   current one, in a full handshake), the server verified
//!   against `--connect-ca` (followed like the certificate files) or the system's roots, under
//!   the name `--connect-sni` (default `HOST`). It prints `listening on tcp://ADDR, carried to
//!   HOST:PORT over TLS`; `--status-listen` shows the client certificate as `client`.
//! - SIGHUP re-reads the files now; SIGINT / SIGTERM stop accepting, let in-flight requests
//!   finish (up to 10 s), and exit 0; a second SIGINT / SIGTERM exits at once (status 130).
//! - The port is reserved at start (a busy port fails at once) but connections are refused
//!   until the first certificate is installed; then the server listens. No certificate within
//!   `--ready-timeout` (default 30 s), or with `--fail-fast` the first failed read, ends it with
//!   the error and status 1.
//!
//! Prints one line, `listening on https://HOST:PORT`, to stdout once the first certificate is
//! installed and the socket listens (then `status on http://HOST:PORT/` with
//! `--status-listen`); logs go to stderr (`RUST_LOG` sets the filter; by default
//! `info`, with third-party HTTP and API clients and the notify crate at `error`), in colour on a
//! terminal only (never with `NO_COLOR` set).
//!
//! Run it from the repository with `cargo run --example serve -- FLAGS` (the README's first
//! command), or install it: `cargo install --path serve` puts `serve` on the `PATH`.
//!
//! # The code
//! - `cli/`: the flags (clap), their values and bounds (`values.rs`), and the rules of which go
//!   together (`check.rs`), giving `Args` (unit tests in `cli/tests.rs`). A new mode
//!   adds its flags under a help heading of its own and a field of `Args`; today's flags keep
//!   their names and meanings.
//! - `run.rs`: the server: the source the flags choose, the reloader, the accept stream, the
//!   signals, the graceful stop. What a connection is answered with is the `app` (the status
//!   page, `status.rs`), or the sidecar's: `proxy/` (`http.rs` the reverse proxy, `tcp.rs`
//!   the bytes, `proxy_protocol.rs` the PROXY v2 header); `allow.rs` the authorization rules
//!   and the file followed; `connect.rs` the outbound client of `--connect`.
//! - `log.rs`: logging to stderr, which the examples share.
//!
//! The end-to-end tests (`tests/serve.rs`, the sidecar's in `tests/sidecar.rs` against the
//! `upstream` example as a process) run the binary as a user does; `SERVE_BIN` points
//! them at another build of it (an installed one, say).

mod allow;
mod cli;
mod connect;
mod log;
mod proxy;
mod run;
mod status;

pub use log::log_to_stderr;

/// serve's `main`: parses the command line (a usage error exits 2, naming the flag), runs the
/// server, and returns its exit status (an error is printed to stderr, status 1).
///
/// # Panics
/// If the tokio runtime cannot be built, or a global `tracing` subscriber is already set.
pub fn main() -> std::process::ExitCode {
    run::main()
}
