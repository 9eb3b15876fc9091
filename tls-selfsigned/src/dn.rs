//! The subject of a generated certificate (leaf or CA).

use rcgen::{DistinguishedName, DnType};

/// A subject of `common_name` and, when given, `organization`.
pub(crate) fn distinguished_name(
    common_name: &str,
    organization: Option<&str>,
) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        dn.push(DnType::OrganizationName, organization);
    }
    dn
}
