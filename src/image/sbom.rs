//! An image's SBOM (made by [`crate::sbom`]) written beside the build and, for an image
//! pushed to a registry, attached there as a referrer of its manifest.

/// Writes the document's `bytes` to `path` (atomically) and, for an image in a registry,
/// attaches them there as a referrer of `manifest` with `media_type` as its artifact type;
/// returns the artifact's digest when it was attached.
pub fn write(
    bytes: &[u8],
    media_type: &str,
    path: &std::path::Path,
    dest: &super::Transport,
    manifest: &super::digest::Digest,
    created: &str,
) -> crate::error::Result<Option<super::digest::Digest>> {
    crate::fsutil::write_atomic(path, bytes)?;
    match dest {
        super::Transport::Registry(remote) => super::referrers::attach(
            remote,
            manifest,
            media_type,
            bytes,
            std::collections::BTreeMap::from([(
                "org.opencontainers.image.created".to_string(),
                created.to_string(),
            )]),
        )
        .map(Some),
        _ => Ok(None),
    }
}
