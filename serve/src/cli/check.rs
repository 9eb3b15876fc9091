//! The rules of which flags go together: [`Cli`] as parsed becomes [`Args`], or a message naming
//! the flags (exit status 2).

use std::net::SocketAddr;
use std::path::PathBuf;

use tls_rotation::acme::ChallengeType;

use super::values::{Secret, default_identity};
use super::*;

impl Cli {
    /// The rules of which flags go together, with the messages serve has always given.
    pub(super) fn check(self) -> Result<Args, String> {
        if self.no_resumption && self.session_tickets != "off" {
            return Err("--no-resumption cannot be combined with --session-tickets".into());
        }
        let sidecar_context = sidecar::Context {
            client_ca: self.client_ca.is_some(),
            server_only: [
                (!self.acme_directory.is_empty(), "--acme-directory"),
                (!self.sni.is_empty(), "--sni"),
                (self.k8s_secrets.is_some(), "--k8s-secrets"),
                (self.etcd_certs, "--etcd-certs"),
                (self.client_ca.is_some(), "--client-ca"),
                (self.session_tickets != "off", "--session-tickets"),
                (self.recycle_after.is_some(), "--recycle-after"),
            ]
            .into_iter()
            .find_map(|(given, flag)| given.then_some(flag)),
        };
        if self.ready_before_lists && self.k8s_secrets.is_none() && !self.etcd_certs {
            return Err("--ready-before-lists goes with --k8s-secrets or --etcd-certs".into());
        }
        let (etcd, etcd_cert, etcd_certs) = self.etcd_flags()?;
        if etcd_certs.is_some() && self.k8s_secrets.is_some() {
            return Err("--etcd-certs cannot be combined with --k8s-secrets".into());
        }
        let mut sni = Sni {
            routes: self.sni,
            strict: self.sni_strict,
            secrets: None,
            etcd_certs,
            ready_before_lists: self.ready_before_lists,
        };
        match (self.k8s_secrets, self.selector) {
            (Some(namespace), selector) => {
                sni.secrets = Some((namespace, selector.unwrap_or_default()));
            }
            (None, Some(_)) => return Err("--selector goes with --k8s-secrets".into()),
            (None, None) => {}
        }
        let files = self.cert.is_some()
            || self.key.is_some()
            || self.ca.is_some()
            || self.cert_dir.is_some();
        if self.k8s_shared.is_none() && self.lease.is_some() {
            return Err("--lease goes with --k8s-shared".into());
        }
        if self.k8s_shared.is_none() && self.etcd_shared.is_none() && self.identity.is_some() {
            return Err("--identity goes with --k8s-shared or --etcd-shared".into());
        }
        if self.etcd_shared.is_none() && self.etcd_lease_ttl.is_some() {
            return Err("--etcd-lease-ttl goes with --etcd-shared".into());
        }
        if let Some(name) = &self.etcd_shared {
            if self.etcd.is_none() {
                return Err("--etcd-shared goes with --etcd ENDPOINTS".into());
            }
            if name.is_empty() || name.contains('/') {
                return Err(format!("--etcd-shared {name:?}: expected a NAME (no '/')"));
            }
            if self.k8s_shared.is_some() || self.k8s_secret.is_some() || etcd_cert.is_some() {
                return Err("--etcd-shared cannot be combined with --k8s-shared, --k8s-secret or --etcd-cert".into());
            }
            if self.seal_served_key {
                return Err("--seal-served-key goes with --k8s-shared: with --etcd-shared and --seal-key every private key is sealed".into());
            }
        }
        if self.client_ca.is_none() && self.ca_overlap.is_some_and(|d| !d.is_zero()) {
            return Err("--ca-overlap goes with --client-ca".into());
        }
        let seal = SealArgs {
            keys: self.seal_key,
            adopt_unsealed: self.seal_adopt_unsealed,
            served_key: self.seal_served_key,
        };
        if seal.keys.is_empty() && (seal.adopt_unsealed || seal.served_key) {
            return Err("--seal-adopt-unsealed and --seal-served-key go with --seal-key".into());
        }
        if etcd_cert.is_some() && (self.k8s_shared.is_some() || !self.acme_directory.is_empty()) {
            return Err(
                "--etcd-cert cannot be combined with --k8s-shared or --acme-directory".into(),
            );
        }
        if !seal.keys.is_empty()
            && self.k8s_shared.is_none()
            && self.k8s_secret.is_none()
            && self.etcd_shared.is_none()
        {
            return Err(
                "--seal-key goes with --k8s-shared or --etcd-shared (or --k8s-secret, to open a sealed tls.key)"
                    .into(),
            );
        }
        if seal.served_key && self.k8s_shared.is_none() {
            return Err("--seal-served-key goes with --k8s-shared".into());
        }
        // --client-ca is a file of its own (CaFileSource), beside any certificate source.
        let acme = Self::acme(
            AcmeFlags {
                directory: self.acme_directory,
                domains: self.acme_domain,
                email: self.acme_email,
                directory_ca: self.acme_directory_ca,
                state: self.acme_state,
                challenge: self.acme_challenge,
                http_listen: self.acme_http_listen,
                weekly_limit: self.acme_weekly_limit,
                profile: self.acme_profile,
                profile_required: self.acme_profile_required,
                eab_kid: self.acme_eab_kid,
                eab_key: self.acme_eab_key,
                dns_server: self.acme_dns_server,
                dns_tsig_key: self.acme_dns_tsig_key,
            },
            match (&self.k8s_shared, &self.etcd_shared) {
                (Some(shared), _) => Some(FleetFlags::K8s {
                    shared: shared.clone(),
                    lease: self.lease.clone(),
                    identity: self.identity.clone(),
                }),
                (None, Some(name)) => Some(FleetFlags::Etcd {
                    prefix: self
                        .etcd_prefix
                        .clone()
                        .unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_owned()),
                    name: name.clone(),
                    identity: self.identity.clone(),
                    ttl: self.etcd_lease_ttl.unwrap_or(DEFAULT_ETCD_LEASE_TTL),
                }),
                (None, None) => None,
            },
        )?;
        // ACME for a fleet takes --k8s-shared or --etcd-shared: the default certificate (for
        // names without an ACME one) is --cert's, or the in-memory self-signed one.
        let acme_fleet = acme
            .as_ref()
            .map(|a| &a.state)
            .and_then(|state| match state {
                AcmeState::Fleet { .. } => Some("--k8s-shared"),
                AcmeState::Etcd { .. } => Some("--etcd-shared"),
                AcmeState::Dir(_) => None,
            });
        if let Some(fleet) = acme_fleet {
            if self.k8s_secret.is_some() {
                return Err(format!(
                    "{fleet} with --acme-directory cannot be combined with --k8s-secret (give the default certificate with --cert)"
                ));
            }
            if seal.served_key {
                return Err("--seal-served-key does not go with --acme-directory: the certificates' Secrets are kubernetes.io/tls Secrets every replica serves through one label-selector watch, which reads a plain tls.key (--seal-key seals the ACME account and the orders' keys)".into());
            }
            if self.self_signed_dir.is_some() || self.self_signed_ca {
                return Err(format!(
                    "--self-signed-dir and --self-signed-ca do not go with --acme-directory and {fleet}: the self-signed default is kept in memory"
                ));
            }
        }
        let tickets = Self::tickets(
            &self.session_tickets,
            self.ticket_rotation,
            self.k8s_shared.as_ref(),
            self.identity.clone(),
        )?;
        let (k8s_shared, etcd_shared) = if acme_fleet.is_some() {
            (None, None)
        } else {
            (self.k8s_shared, self.etcd_shared)
        };
        let self_signed = SelfSignedArgs {
            names: self.name,
            validity: self.self_signed_validity,
            dir: self.self_signed_dir,
            ca: self.self_signed_ca,
        };
        let self_signed_flags = self_signed != SelfSignedArgs::default();
        let certs = if let Some((namespace, name)) = k8s_shared {
            if files || self.k8s_secret.is_some() {
                return Err(
                    "--k8s-shared cannot be combined with --cert, --cert-dir or --k8s-secret"
                        .into(),
                );
            }
            if self_signed.dir.is_some() {
                return Err(
                    "--self-signed-dir does not go with --k8s-shared: the Secret is the store"
                        .into(),
                );
            }
            let identity = identity(self.identity)?;
            Certs::Shared {
                namespace,
                name,
                lease: self.lease,
                identity,
                options: self_signed,
            }
        } else if let Some((namespace, name)) = self.k8s_secret {
            if files || self_signed_flags || etcd_cert.is_some() {
                return Err("--k8s-secret cannot be combined with other certificate flags".into());
            }
            Certs::Secret { namespace, name }
        } else if let Some(name) = etcd_shared {
            if files {
                return Err("--etcd-shared cannot be combined with --cert, --cert-dir".into());
            }
            if self_signed.dir.is_some() {
                return Err(
                    "--self-signed-dir does not go with --etcd-shared: etcd is the store".into(),
                );
            }
            Certs::EtcdShared {
                prefix: self
                    .etcd_prefix
                    .clone()
                    .unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_owned()),
                name,
                identity: identity(self.identity)?,
                ttl: self.etcd_lease_ttl.unwrap_or(DEFAULT_ETCD_LEASE_TTL),
                options: self_signed,
            }
        } else if let Some(key) = etcd_cert {
            if files || self_signed_flags {
                return Err("--etcd-cert cannot be combined with other certificate flags".into());
            }
            Certs::Etcd { key }
        } else {
            if files && self_signed_flags {
                return Err("--name and --self-signed-* apply to the self-signed default, not to --cert or --cert-dir".into());
            }
            match (self.cert, self.key, self.ca, self.cert_dir) {
                (None, None, None, None) => Certs::SelfSigned(self_signed),
                (None, None, None, Some(dir)) => Certs::Dir(dir),
                (Some(cert), Some(key), ca, None) => Certs::Files { cert, key, ca },
                (_, _, _, Some(_)) => {
                    return Err("--cert-dir cannot be combined with --cert, --key or --ca".into());
                }
                _ => return Err("--cert and --key go together (and --ca needs them)".into()),
            }
        };
        let (mode, status_listen, allow) = self.sidecar.check(&sidecar_context)?;
        Ok(Args {
            listen: self.listen,
            certs,
            poll: self.poll,
            notify: !self.no_notify,
            sni,
            ready_timeout: self.ready_timeout,
            fail_fast: self.fail_fast,
            handshake_timeout: self.handshake_timeout,
            recycle_after: self.recycle_after,
            client_ca: self
                .client_ca
                .map(|path| (path, self.ca_overlap.unwrap_or_default())),
            metrics: self.metrics,
            seal,
            acme,
            tickets,
            no_resumption: self.no_resumption,
            etcd,
            mode,
            status_listen,
            allow,
        })
    }

    /// The etcd flags: how to reach etcd, the key of `--etcd-cert` and the prefix of
    /// `--etcd-certs` (each `None` when not given).
    #[allow(clippy::type_complexity)]
    fn etcd_flags(&self) -> Result<(Option<EtcdArgs>, Option<String>, Option<String>), String> {
        let Some(endpoints) = &self.etcd else {
            let given = [
                ("--etcd-prefix", self.etcd_prefix.is_some()),
                ("--etcd-cert", self.etcd_cert.is_some()),
                ("--etcd-certs", self.etcd_certs),
                ("--etcd-user", self.etcd_user.is_some()),
                ("--etcd-password-file", self.etcd_password_file.is_some()),
                ("--etcd-ca", self.etcd_ca.is_some()),
                ("--etcd-client-cert", self.etcd_client_cert.is_some()),
                ("--etcd-client-key", self.etcd_client_key.is_some()),
            ];
            if let Some((flag, _)) = given.into_iter().find(|(_, given)| *given) {
                return Err(format!("{flag} goes with --etcd ENDPOINTS"));
            }
            return Ok((None, None, None));
        };
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        if endpoints.is_empty() {
            return Err("--etcd: expected ENDPOINTS, e.g. 127.0.0.1:2379,127.0.0.2:2379".into());
        }
        if self.etcd_cert.is_none() && !self.etcd_certs && self.etcd_shared.is_none() {
            return Err(
                "--etcd needs --etcd-cert NAME, --etcd-certs or --etcd-shared NAME (what to serve)"
                    .into(),
            );
        }
        let mut prefix = self
            .etcd_prefix
            .clone()
            .unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_owned());
        if prefix.is_empty() {
            return Err("--etcd-prefix: expected a PREFIX, e.g. /tls-rotation/".into());
        }
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let certs = format!("{prefix}certs/");
        let cert = match &self.etcd_cert {
            Some(name) if name.is_empty() || name.starts_with('/') => {
                return Err(format!(
                    "--etcd-cert {name:?}: expected a NAME (the key is {certs}NAME)"
                ));
            }
            Some(name) => Some(format!("{certs}{name}")),
            None => None,
        };
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => Some((user.clone(), file.clone())),
            (None, None) => None,
            _ => return Err("--etcd-user and --etcd-password-file go together".into()),
        };
        let client = match (&self.etcd_client_cert, &self.etcd_client_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("--etcd-client-cert and --etcd-client-key go together".into()),
        };
        if client.is_some() && self.etcd_ca.is_none() {
            return Err(
                "--etcd-client-cert needs --etcd-ca (the CA etcd's certificate is checked with)"
                    .into(),
            );
        }
        let etcd = EtcdArgs {
            endpoints,
            user,
            ca: self.etcd_ca.clone(),
            client,
        };
        Ok((Some(etcd), cert, self.etcd_certs.then_some(certs)))
    }

    /// `--session-tickets` and `--ticket-rotation`; a FILE is read here, so that a bad one is a
    /// usage error naming it.
    fn tickets(
        mode: &str,
        rotation: Option<Duration>,
        fleet: Option<&(String, String)>,
        identity_flag: Option<String>,
    ) -> Result<Tickets, String> {
        let every = rotation.unwrap_or(tls_rotation::DEFAULT_TICKET_ROTATION);
        match (mode, fleet) {
            ("off", _) if rotation.is_some() => {
                Err("--ticket-rotation goes with --session-tickets fleet or FILE".into())
            }
            ("off", _) => Ok(Tickets::Off),
            ("fleet", None) => Err(
                "--session-tickets fleet goes with --k8s-shared (the fleet whose Lease holder writes the keys); for processes outside a fleet, give a FILE".into(),
            ),
            ("fleet", Some((namespace, name))) => Ok(Tickets::Fleet {
                namespace: namespace.clone(),
                name: name.clone(),
                identity: identity(identity_flag)?,
                rotation: every,
            }),
            (path, _) => {
                use base64::Engine as _;
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--session-tickets {path}: cannot read it: {e}"))?;
                let secret = base64::engine::general_purpose::STANDARD
                    .decode(text.trim())
                    .ok()
                    .filter(|bytes| bytes.len() >= 32)
                    .ok_or_else(|| {
                        format!(
                            "--session-tickets {path}: not 32 or more bytes in base64 (make one with openssl rand -base64 32; the content is not shown: it is a secret)"
                        )
                    })?;
                Ok(Tickets::File {
                    path: PathBuf::from(path),
                    secret: TicketSecret(secret),
                    rotation: every,
                })
            }
        }
    }

    /// The `--acme-*` flags, checked together and against what tls-acme accepts.
    fn acme(flags: AcmeFlags, fleet: Option<FleetFlags>) -> Result<Option<AcmeArgs>, String> {
        let mut directories = flags.directory.into_iter();
        let Some(first) = directories.next() else {
            let given = !flags.domains.is_empty()
                || flags.email.is_some()
                || flags.directory_ca.is_some()
                || flags.state.is_some()
                || flags.challenge.is_some()
                || flags.http_listen.is_some()
                || flags.profile.is_some()
                || flags.profile_required.is_some()
                || flags.eab_kid.is_some()
                || flags.eab_key.is_some()
                || flags.dns_server.is_some()
                || flags.dns_tsig_key.is_some();
            if given {
                return Err("the --acme-* flags go with --acme-directory".into());
            }
            return Ok(None);
        };
        let directory = first.url;
        // The first's ca= and eab-*= are --acme-directory-ca and --acme-eab-*'s.
        let directory_ca = match (flags.directory_ca, first.ca) {
            (Some(_), Some(_)) => {
                return Err("--acme-directory-ca and the first --acme-directory's ca= do not go together: give one".into());
            }
            (ca, from_url) => ca.or(from_url),
        };
        let first_eab = match (first.eab_kid, first.eab_key_file) {
            (Some(kid), Some(file)) => Some((kid, super::values::eab_key_file(&file)?)),
            _ => None,
        };
        let mut fallbacks = Vec::new();
        for flag in directories {
            if flag.url == directory || fallbacks.iter().any(|f: &FallbackArgs| f.url == flag.url) {
                return Err(format!("--acme-directory {}: given twice", flag.url));
            }
            let eab = match (flag.eab_kid, flag.eab_key_file) {
                (Some(kid), Some(file)) => Some((kid, super::values::eab_key_file(&file)?)),
                _ => None,
            };
            fallbacks.push(FallbackArgs {
                url: flag.url,
                ca: flag.ca,
                eab,
            });
        }
        if flags.domains.is_empty() {
            return Err("--acme-directory needs at least one --acme-domain".into());
        }
        let challenge = flags.challenge.unwrap_or_default();
        if challenge != ChallengeType::Dns01
            && let Some(wildcard) = flags.domains.iter().find(|d| d.starts_with("*."))
        {
            return Err(format!(
                "--acme-domain {wildcard}: a wildcard can only be validated by dns-01 (--acme-challenge dns-01 --acme-dns-server HOST:PORT --acme-dns-tsig-key FILE)"
            ));
        }
        let dns = match (challenge, flags.dns_server, flags.dns_tsig_key) {
            (ChallengeType::Dns01, Some(server), Some(key)) => {
                // Read now, so that a bad key file stops serve at once, naming the file.
                let tsig = tls_rotation::acme::rfc2136::TsigKey::from_file(&key)
                    .map_err(|e| format!("--acme-dns-tsig-key: {e}"))?;
                let solver = tls_rotation::acme::rfc2136::Rfc2136::new(server.clone(), tsig)
                    .map_err(|e| format!("--acme-dns-server: {e}"))?;
                Some((server, key, solver))
            }
            (ChallengeType::Dns01, _, _) => {
                return Err(
                    "--acme-challenge dns-01 needs --acme-dns-server HOST:PORT and --acme-dns-tsig-key FILE (the zone's primary, and the TSIG key its update-policy grants)"
                        .into(),
                );
            }
            (_, None, None) => None,
            (_, _, _) => {
                return Err(
                    "--acme-dns-server and --acme-dns-tsig-key go with --acme-challenge dns-01"
                        .into(),
                );
            }
        };
        match (challenge, flags.http_listen) {
            (ChallengeType::Http01, None) => {
                return Err(
                    "--acme-challenge http-01 needs --acme-http-listen (where the CA's request arrives)"
                        .into(),
                );
            }
            (ChallengeType::Http01, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err("--acme-http-listen goes with --acme-challenge http-01".into());
            }
        }
        let profile = match (flags.profile, flags.profile_required) {
            (Some(_), Some(_)) => {
                return Err(
                    "--acme-profile and --acme-profile-required do not go together: give one"
                        .into(),
                );
            }
            (Some(name), None) => Some((name, false)),
            (None, Some(name)) => Some((name, true)),
            (None, None) => None,
        };
        let eab = match (flags.eab_kid, flags.eab_key, first_eab) {
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return Err("--acme-eab-kid/--acme-eab-key and the first --acme-directory's eab-kid=/eab-key-file= do not go together: give one".into());
            }
            (Some(kid), Some(key), None) => Some((kid, eab_key(&key.0)?)),
            (None, None, from_url) => from_url,
            _ => return Err("--acme-eab-kid and --acme-eab-key go together".into()),
        };
        let state = match (flags.state, fleet) {
            (Some(_), Some(_)) => {
                return Err("--acme-state does not go with --k8s-shared or --etcd-shared: the fleet's state is kept in its Secrets, or in etcd".into());
            }
            (Some(dir), None) => AcmeState::Dir(dir),
            (
                None,
                Some(FleetFlags::K8s {
                    shared: (namespace, name),
                    lease,
                    identity: given,
                }),
            ) => AcmeState::Fleet {
                namespace,
                name,
                lease,
                identity: identity(given)?,
            },
            (
                None,
                Some(FleetFlags::Etcd {
                    prefix,
                    name,
                    identity: given,
                    ttl,
                }),
            ) => AcmeState::Etcd {
                prefix,
                name,
                identity: identity(given)?,
                ttl,
            },
            (None, None) => {
                return Err("--acme-directory needs --acme-state DIR (or --k8s-shared NAMESPACE/NAME, or --etcd-shared NAME, for a fleet): without it every restart orders every certificate again".into());
            }
        };
        // What the library refuses, refused here with the flag named (exit 2, not 1).
        let solver = dns.as_ref().map(|(_, _, solver)| solver.clone());
        let check = |builder: tls_rotation::acme::AcmeBuilder| {
            let builder = match &solver {
                Some(solver) => builder.dns01_solver(std::sync::Arc::new(solver.clone())),
                None => builder,
            };
            builder
                .crypto_provider(crypto_provider())
                // Only checked: nothing is read or written at build.
                .state_dir("/")
                .challenge(challenge)
                .build()
                .map(drop)
        };
        for domain in &flags.domains {
            check(tls_rotation::acme::Acme::builder(&directory).name(domain))
                .map_err(|e| format!("--acme-domain {domain}: {}", config_reason(&e)))?;
        }
        check(flags.domains.iter().fold(
            tls_rotation::acme::Acme::builder(&directory),
            tls_rotation::acme::AcmeBuilder::name,
        ))
        .map_err(|e| format!("--acme-domain: {}", config_reason(&e)))?;
        if let Some(ca) = &directory_ca {
            check(
                tls_rotation::acme::Acme::builder(&directory)
                    .name(&flags.domains[0])
                    .directory_ca_file(ca),
            )
            .map_err(|e| {
                format!(
                    "--acme-directory-ca {}: {}",
                    ca.display(),
                    config_reason(&e)
                )
            })?;
        }
        for fallback in &fallbacks {
            if let Some(ca) = &fallback.ca {
                check(
                    tls_rotation::acme::Acme::builder(&directory)
                        .name(&flags.domains[0])
                        .fallback(tls_rotation::acme::FallbackCa::new(&fallback.url).ca_file(ca)),
                )
                .map_err(|e| {
                    format!(
                        "--acme-directory {},ca={}: {}",
                        fallback.url,
                        ca.display(),
                        config_reason(&e)
                    )
                })?;
            }
        }
        Ok(Some(AcmeArgs {
            directory,
            domains: flags.domains,
            email: flags.email,
            directory_ca,
            state,
            challenge,
            http_listen: flags.http_listen,
            weekly_limit: flags.weekly_limit,
            profile,
            eab,
            fallbacks,
            dns: dns.map(|(server, key, _)| (server, key)),
        }))
    }
}

/// A fleet's flags as given, for ACME in a fleet: `--k8s-shared` (and its `--lease`,
/// `--identity`), or `--etcd-shared` (and its `--etcd-prefix`, `--identity`,
/// `--etcd-lease-ttl`).
enum FleetFlags {
    K8s {
        shared: (String, String),
        lease: Option<String>,
        identity: Option<String>,
    },
    Etcd {
        prefix: String,
        name: String,
        identity: Option<String>,
        ttl: Duration,
    },
}

/// The etcd prefix of every key serve reads or writes without `--etcd-prefix`.
const DEFAULT_ETCD_PREFIX: &str = "/tls-rotation/";

/// The writer lease's default TTL with `--etcd-shared`.
const DEFAULT_ETCD_LEASE_TTL: Duration = Duration::from_secs(15);

/// This replica's name in a Lease (or as etcd's writer): `--identity`, else `$POD_NAME` or the
/// host name.
fn identity(given: Option<String>) -> Result<String, String> {
    given.or_else(default_identity).ok_or_else(|| {
        "--k8s-shared and --etcd-shared need --identity (no POD_NAME, no host name)".to_owned()
    })
}

/// The `--acme-*` flags as given.
struct AcmeFlags {
    directory: Vec<DirectoryFlag>,
    domains: Vec<String>,
    email: Option<String>,
    directory_ca: Option<PathBuf>,
    state: Option<PathBuf>,
    challenge: Option<ChallengeType>,
    http_listen: Option<SocketAddr>,
    weekly_limit: u32,
    profile: Option<String>,
    profile_required: Option<String>,
    eab_kid: Option<String>,
    eab_key: Option<Secret>,
    dns_server: Option<String>,
    dns_tsig_key: Option<PathBuf>,
}

/// The reason of a configuration error, without the library's prefix.
fn config_reason(error: &tls_rotation::acme::Error) -> String {
    match error {
        tls_rotation::acme::Error::Config(reason) => reason.clone(),
        other => other.to_string(),
    }
}
