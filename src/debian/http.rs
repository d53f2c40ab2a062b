//! Blocking HTTP GETs of archive files, with the failures sorted as the rest of gpubake sorts
//! them: an archive out of reach or a file it does not have is the environment (exit 3).

use crate::error::{Error, Result};
use std::time::Duration;

/// One agent for all of an archive client's requests, so connections are reused.
#[derive(Clone, Debug)]
pub struct Client {
    agent: ureq::Agent,
}

impl Default for Client {
    fn default() -> Self {
        Client::new(Duration::from_secs(30))
    }
}

impl Client {
    /// A client that gives up on a connection, or on a read that stalls, after `timeout`.
    pub fn new(timeout: Duration) -> Client {
        // Most archives are plain HTTP anyway, their integrity coming from the signed
        // InRelease; for those that are not, crate::net trusts the system's store.
        Client {
            agent: crate::net::agent(timeout, timeout),
        }
    }

    /// The body of `url`, at most `limit` bytes: more is refused, since an index file that
    /// outgrows its limit is not one an archive serves.
    pub fn get(&self, url: &str, limit: u64) -> Result<Vec<u8>> {
        let mut response = self.agent.get(url).call().map_err(|e| {
            Error::Environment(format!(
                "cannot reach the package archive at {url}: {e}; where the archive is out of \
                 reach, `build --offline --lock LOCK` installs the pins an earlier `resolve -o` \
                 wrote, from the .debs in the cache"
            ))
        })?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(Error::Environment(format!(
                "the package archive answered HTTP {status} for {url}"
            )));
        }
        response
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| Error::Environment(format!("reading {url} from the package archive: {e}")))
    }
}
