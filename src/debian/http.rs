//! Blocking HTTP GETs of archive files, with the failures sorted as the rest of gpubake sorts
//! them: an archive out of reach or a file it does not have is the environment (exit 3).

use crate::error::{Error, Result};
use std::io::Read;
use std::time::Duration;

/// One HTTP client for all of an archive client's requests, so connections are reused.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::blocking::Client,
}

impl Client {
    /// A client that gives up on a connection, or on a read that stalls, after `timeout`.
    pub fn new(timeout: Duration) -> Result<Client> {
        // Most archives are plain HTTP anyway, their integrity coming from the signed
        // InRelease; for those that are not, crate::net trusts the system's store.
        Ok(Client {
            http: crate::net::client(timeout, timeout)?,
        })
    }

    /// The body of `url`, at most `limit` bytes: more is refused, since an index file that
    /// outgrows its limit is not one an archive serves.
    pub fn get(&self, url: &str, limit: u64) -> Result<Vec<u8>> {
        let response = self.http.get(url).send().map_err(|e| {
            Error::Environment(format!(
                "cannot reach the package archive at {url}: {}; where the archive is out of \
                 reach, `build --offline --lock LOCK` installs the pins an earlier `resolve -o` \
                 wrote, from the .debs in the cache",
                crate::net::chain(&e)
            ))
        })?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(Error::Environment(format!(
                "the package archive answered HTTP {status} for {url}"
            )));
        }
        let mut body = Vec::new();
        response
            .take(limit.saturating_add(1))
            .read_to_end(&mut body)
            .map_err(|e| {
                Error::Environment(format!("reading {url} from the package archive: {e}"))
            })?;
        if body.len() as u64 > limit {
            return Err(Error::Environment(format!(
                "reading {url} from the package archive: the body is larger than the \
                 {limit} bytes such a file may have"
            )));
        }
        Ok(body)
    }
}
