//! Who a request speaks for: the server's tenants, their tokens and quotas, and the
//! labels that tie each sandbox to the tenant that created it.
//!
//! A tenant sees and touches only sandboxes carrying its name in [`TENANT_LABEL`]; the
//! label is set by the server on create (a client's own `sandcell.server.*` labels are
//! refused first, [`super::labels`]), so no request can claim another tenant's sandbox.

use std::collections::HashSet;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandcell::{Error, ErrorKind, LabelSelector, Result, SandboxBackend, SandboxSpec};
use serde::Deserialize;

use sandcell_remote::protocol::ErrorBody;

/// The label naming the tenant a sandbox belongs to, which the server sets on every
/// sandbox it makes (and refuses from clients): for a backend that groups sandboxes by
/// a label, such as the local backend's `watch_budget_label`.
pub const TENANT_LABEL: &str = "sandcell.server.tenant";
/// Label holding the CPU (thousandths of a core) a sandbox counts against its quota.
pub(crate) const CPU_LABEL: &str = "sandcell.server.cpu_millis";
/// Label holding the memory (bytes) a sandbox counts against its quota.
pub(crate) const MEMORY_LABEL: &str = "sandcell.server.memory_bytes";
/// Label holding a sandbox's disk limit (bytes), where it has one: what the E2B face
/// reports as its disk size.
pub(crate) const DISK_LABEL: &str = "sandcell.server.disk_bytes";

/// What a sandbox without a CPU limit counts against a CPU quota: one core.
const UNSET_CPU_MILLIS: u32 = 1000;
/// What a sandbox without a memory limit counts against a memory quota: 512 MiB.
const UNSET_MEMORY_BYTES: u64 = 512 << 20;

/// A client of the server: a name, the token that proves it, and optional quotas.
///
/// As a tenants file spells it (`sandcell-server --tenants FILE`):
///
/// ```yaml
/// tenants:
///   - name: acme
///     token: "a-long-random-secret"
///     max_sandboxes: 10
///     max_cpus: 8
///     max_memory_mb: 16384
///   - name: globex
///     token: "another-long-random-secret"
/// ```
///
/// A sandbox that sets no CPU (memory) limit counts as one core (512 MiB) against a
/// tenant's CPU (memory) quota, and when the backend enforces that limit it is created
/// with it, so what the quota counts is what the sandbox gets.
///
/// ```
/// use sandcell_server::{ServerConfig, Tenant};
///
/// let config = ServerConfig::with_tenants([
///     Tenant::new("acme", "a-long-random-secret").max_sandboxes(10),
///     Tenant::new("globex", "another-long-random-secret"),
/// ])?;
/// assert_eq!(config.tenants().len(), 2);
/// # Ok::<(), sandcell::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Tenant {
    /// The tenant's name, unique on the server (it labels the tenant's sandboxes).
    pub name: String,
    /// The bearer token the tenant's requests carry; unique on the server.
    pub token: String,
    /// Most sandboxes (running or paused) the tenant may have at once.
    #[serde(default)]
    pub max_sandboxes: Option<u32>,
    /// Most CPU cores the tenant's sandboxes may be given together.
    #[serde(default)]
    pub max_cpus: Option<u32>,
    /// Most memory, in MiB, the tenant's sandboxes may be given together.
    #[serde(default)]
    pub max_memory_mb: Option<u64>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("max_sandboxes", &self.max_sandboxes)
            .field("max_cpus", &self.max_cpus)
            .field("max_memory_mb", &self.max_memory_mb)
            .finish()
    }
}

impl Tenant {
    /// A tenant without quotas.
    pub fn new(name: impl Into<String>, token: impl Into<String>) -> Self {
        Tenant {
            name: name.into(),
            token: token.into(),
            max_sandboxes: None,
            max_cpus: None,
            max_memory_mb: None,
        }
    }

    /// Caps how many sandboxes the tenant may have at once.
    pub fn max_sandboxes(mut self, n: u32) -> Self {
        self.max_sandboxes = Some(n);
        self
    }

    /// Caps the CPU cores the tenant's sandboxes may be given together.
    pub fn max_cpus(mut self, n: u32) -> Self {
        self.max_cpus = Some(n);
        self
    }

    /// Caps the memory, in MiB, the tenant's sandboxes may be given together.
    pub fn max_memory_mb(mut self, n: u64) -> Self {
        self.max_memory_mb = Some(n);
        self
    }
}

/// The file `sandcell-server --tenants` reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsFile {
    /// The tenants, at least one.
    pub tenants: Vec<Tenant>,
}

impl TenantsFile {
    /// Reads a tenants file's YAML; the error names what is wrong, never a token.
    pub fn from_yaml(text: &str) -> Result<Vec<Tenant>> {
        let file: TenantsFile = serde_yaml::from_str(text)
            .map_err(|e| Error::invalid_input(format!("a malformed tenants file: {e}")))?;
        Ok(file.tenants)
    }
}

/// Checks a server's tenants: at least one, names and tokens non-empty and unique.
pub(crate) fn validate(tenants: &[Tenant]) -> Result<()> {
    if tenants.is_empty() {
        return Err(Error::invalid_input("a server needs at least one tenant"));
    }
    let mut names = HashSet::new();
    let mut tokens = HashSet::new();
    for tenant in tenants {
        if tenant.name.trim().is_empty() {
            return Err(Error::invalid_input("a tenant has an empty name"));
        }
        if tenant.token.trim().is_empty() {
            return Err(Error::invalid_input(format!(
                "tenant {:?} has an empty token, which would let anyone in",
                tenant.name
            )));
        }
        if !names.insert(tenant.name.as_str()) {
            return Err(Error::invalid_input(format!(
                "tenant {:?} is named twice",
                tenant.name
            )));
        }
        if !tokens.insert(tenant.token.as_str()) {
            return Err(Error::invalid_input(format!(
                "tenant {:?} shares its token with another tenant",
                tenant.name
            )));
        }
    }
    Ok(())
}

/// The tenant a request authenticated as.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Arc<Tenant>);

/// The tenant whose token `given` is. Every tenant's token is compared, each in time
/// that depends only on the stored token's length, so timing tells neither which
/// tenant nor how much of a token matched.
pub(crate) fn authenticate(tenants: &[Arc<Tenant>], given: &[u8]) -> Option<Arc<Tenant>> {
    let mut found = None;
    for tenant in tenants {
        if constant_time_eq(given, tenant.token.as_bytes()) {
            found = Some(Arc::clone(tenant));
        }
    }
    found
}

/// Compares `given` against `stored` in time depending on `stored`'s length alone.
fn constant_time_eq(given: &[u8], stored: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != stored.len());
    for (i, byte) in stored.iter().enumerate() {
        diff |= byte ^ given.get(i).copied().unwrap_or(!byte);
    }
    std::hint::black_box(diff) == 0
}

/// Marks `spec` as `tenant`'s: refuses a spec no client may ask for (a reserved label,
/// a zero limit: see [`admissible`]), labels the tenant, gives it the server's default
/// limits the backend enforces, and records (and, where the backend enforces it, sets)
/// what the sandbox counts against the tenant's quotas.
pub(crate) fn claim(spec: &mut SandboxSpec, tenant: &Tenant, state: &super::Shared) -> Result<()> {
    admissible(spec, &state.reserved)?;
    mark(
        spec,
        tenant,
        &state.backend.capabilities(),
        &state.config.default_limits,
    );
    Ok(())
}

/// The part of [`claim`] that trusts the spec (MCP's manager made it): labels the
/// tenant, gives the spec `default_limits` where `caps` enforce them, and records what
/// it counts against the quotas.
pub(crate) fn mark(
    spec: &mut SandboxSpec,
    tenant: &Tenant,
    caps: &sandcell::Capabilities,
    default_limits: &sandcell::Limits,
) {
    spec.labels
        .insert(TENANT_LABEL.to_owned(), tenant.name.clone());
    spec.limits = std::mem::take(&mut spec.limits).with_enforced_defaults(default_limits, caps);
    if tenant.max_cpus.is_some() && caps.cpu_limit {
        spec.limits.cpu_millis.get_or_insert(UNSET_CPU_MILLIS);
    }
    if tenant.max_memory_mb.is_some() && caps.memory_limit {
        spec.limits.memory_bytes.get_or_insert(UNSET_MEMORY_BYTES);
    }
    let cpu = spec.limits.cpu_millis.unwrap_or(UNSET_CPU_MILLIS);
    let memory = spec.limits.memory_bytes.unwrap_or(UNSET_MEMORY_BYTES);
    spec.labels.insert(CPU_LABEL.to_owned(), cpu.to_string());
    spec.labels
        .insert(MEMORY_LABEL.to_owned(), memory.to_string());
    if let Some(disk) = spec.limits.disk_bytes {
        spec.labels.insert(DISK_LABEL.to_owned(), disk.to_string());
    }
}

/// Refuses, as `InvalidInput` before any backend work, what a client may not ask
/// for: a label the server keeps for itself (ADVERSARIAL case 39), and a limit of zero
/// CPU, memory, processes or disk, which no sandbox can start under (a backend would
/// otherwise fail slowly, naming its own host paths).
pub(crate) fn admissible(spec: &SandboxSpec, reserved: &super::labels::Reserved) -> Result<()> {
    reserved.check(&spec.labels, "label")?;
    let limits = &spec.limits;
    let zero = [
        ("cpu", limits.cpu_millis.map(u64::from)),
        ("memory", limits.memory_bytes),
        ("pids", limits.pids.map(u64::from)),
        ("disk", limits.disk_bytes),
    ]
    .into_iter()
    .find(|(_, v)| *v == Some(0));
    if let Some((name, _)) = zero {
        return Err(Error::invalid_input(format!(
            "a {name} limit of 0 leaves the sandbox nothing to run with: ask for more, \
             or for none to get the server's default"
        )));
    }
    Ok(())
}

/// One lock per tenant, serialising that tenant's creates on every face (MCP's too) so
/// its name checks and quota counts do not interleave; tenants never wait on each
/// other. Made with the configuration, so what MCP's manager creates through shares it.
#[derive(Debug, Default)]
pub(crate) struct CreateLocks(std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>);

impl CreateLocks {
    pub(crate) fn of(tenants: &[Tenant]) -> CreateLocks {
        CreateLocks(
            tenants
                .iter()
                .map(|t| (t.name.clone(), Arc::default()))
                .collect(),
        )
    }

    /// Holds `tenant`'s create lock (a name the server does not have gets one of its
    /// own, which no one else holds).
    pub(crate) async fn hold(&self, tenant: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self.0.get(tenant).cloned().unwrap_or_default();
        lock.lock_owned().await
    }
}

/// A selector for `tenant`'s sandboxes.
pub(crate) fn selector(tenant: &Tenant) -> LabelSelector {
    LabelSelector::new().label(TENANT_LABEL, &tenant.name)
}

/// Marks `labels`, a clone of `source` asks for, as `tenant`'s: refuses a reserved
/// label, labels the tenant, and counts the clone against the quotas as the source
/// counts (a clone has the source's limits).
pub(crate) fn claim_clone(
    labels: &mut std::collections::BTreeMap<String, String>,
    tenant: &Tenant,
    source: &sandcell::SandboxInfo,
    reserved: &super::labels::Reserved,
) -> Result<()> {
    reserved.check(labels.iter(), "label")?;
    count_as_source(labels, tenant, source);
    Ok(())
}

/// Labels `tenant` on a clone's `labels`, and what `source` counts against the quotas.
pub(crate) fn count_as_source(
    labels: &mut std::collections::BTreeMap<String, String>,
    tenant: &Tenant,
    source: &sandcell::SandboxInfo,
) {
    labels.insert(TENANT_LABEL.to_owned(), tenant.name.clone());
    for label in [CPU_LABEL, MEMORY_LABEL, DISK_LABEL] {
        if let Some(value) = source.labels.get(label) {
            labels.insert(label.to_owned(), value.clone());
        }
    }
}

/// Refuses `spec` (already [`claim`]ed) when it would take `tenant` past a quota:
/// `LimitExceeded`, its message naming the limit (the Fly face answers it `403`, the
/// E2B face `429` as E2B does).
/// Callers hold the tenant's create lock, so none of its other creates slips between
/// the count and the create.
pub(crate) async fn check_quota(
    backend: &dyn SandboxBackend,
    tenant: &Tenant,
    spec: &SandboxSpec,
) -> Result<()> {
    if tenant.max_sandboxes.is_none() && tenant.max_cpus.is_none() && tenant.max_memory_mb.is_none()
    {
        return Ok(());
    }
    let owned = backend.list(&selector(tenant)).await?;
    // What each sandbox counts was recorded in its labels by `claim`, `spec`'s too.
    let counted = |labels: &std::collections::BTreeMap<String, String>, label: &str| -> u64 {
        labels.get(label).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let name = &tenant.name;
    if let Some(max) = tenant.max_sandboxes {
        if owned.len() as u64 >= u64::from(max) {
            return Err(refuse(format!(
                "tenant {name} has reached its limit max_sandboxes ({max}); destroy one first"
            )));
        }
    }
    if let Some(max) = tenant.max_cpus {
        let used: u64 = owned.iter().map(|i| counted(&i.labels, CPU_LABEL)).sum();
        let asked = counted(&spec.labels, CPU_LABEL);
        if used + asked > u64::from(max) * 1000 {
            return Err(refuse(format!(
                "tenant {name} would exceed its limit max_cpus ({max}): {} in use, {} asked",
                cores(used),
                cores(asked)
            )));
        }
    }
    if let Some(max) = tenant.max_memory_mb {
        let used: u64 = owned.iter().map(|i| counted(&i.labels, MEMORY_LABEL)).sum();
        let asked = counted(&spec.labels, MEMORY_LABEL);
        if used.saturating_add(asked) > max.saturating_mul(1 << 20) {
            return Err(refuse(format!(
                "tenant {name} would exceed its limit max_memory_mb ({max}): {} MiB in use, \
                 {} MiB asked",
                used >> 20,
                asked >> 20
            )));
        }
    }
    Ok(())
}

/// Thousandths of a core as cores, e.g. `1.5`.
fn cores(millis: u64) -> String {
    format!("{}", millis as f64 / 1000.0)
}

/// A quota refusal, kind `limit_exceeded`: on the Fly face `403` (not `429`: Fly
/// clients retry that, and waiting does not lift a quota); on the E2B face `429`, as
/// E2B answers a team over its concurrent sandboxes.
fn refuse(message: String) -> Error {
    Error::new(ErrorKind::LimitExceeded, message)
}

/// A quota refusal as the Fly face answers it: `403` with kind `limit_exceeded`.
pub(crate) fn refusal_response(error: &Error) -> Response {
    let body = ErrorBody {
        error: error.message().to_owned(),
        kind: Some(ErrorKind::LimitExceeded.name().to_owned()),
    };
    (StatusCode::FORBIDDEN, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"secrets", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(!constant_time_eq(b"Secret", b"secret"));
        // A given token one byte short whose next byte would match the filler.
        assert!(!constant_time_eq(&[0xff], &[0xff, 0x00]));
    }

    #[test]
    fn a_tenants_file_is_read_and_checked() {
        let tenants = TenantsFile::from_yaml(
            "tenants:\n  - {name: a, token: ta, max_sandboxes: 2}\n  - {name: b, token: tb}\n",
        )
        .unwrap();
        assert_eq!(tenants.len(), 2);
        assert_eq!(tenants[0].max_sandboxes, Some(2));
        validate(&tenants).unwrap();

        let unknown = TenantsFile::from_yaml("tenants:\n  - {name: a, token: t, max_gpus: 1}\n");
        assert_eq!(unknown.unwrap_err().kind(), ErrorKind::InvalidInput);
        let shared = [Tenant::new("a", "t"), Tenant::new("b", "t")];
        let err = validate(&shared).unwrap_err();
        assert!(err.to_string().contains("shares its token"), "{err}");
        assert!(!err.to_string().contains("\"t\""), "a token leaked: {err}");
        assert!(validate(&[Tenant::new("a", " ")]).is_err());
        assert!(validate(&[Tenant::new("a", "x"), Tenant::new("a", "y")]).is_err());
        assert!(validate(&[]).is_err());
        assert!(!format!("{:?}", Tenant::new("a", "hidden")).contains("hidden"));
    }

    #[test]
    fn the_caller_is_the_tenant_whose_token_matches() {
        let tenants: Vec<_> = [Tenant::new("a", "token-a"), Tenant::new("b", "token-b")]
            .into_iter()
            .map(Arc::new)
            .collect();
        assert_eq!(authenticate(&tenants, b"token-b").unwrap().name, "b");
        assert!(authenticate(&tenants, b"token-").is_none());
        assert!(authenticate(&tenants, b"").is_none());
    }
}
