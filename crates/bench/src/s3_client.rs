//! A small blocking S3 client for the bench: path-style requests
//! (`http://endpoint/bucket/key`) signed with SigV4 in the `Authorization`
//! header, on one keep-alive HTTP/1.1 connection per client (ureq), as
//! awscli or boto3 would send them. Enough S3 for measuring: PUT, GET,
//! HEAD and DELETE of objects, ListObjectsV2, CreateBucket.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use ureq::http::{Request, Response};
use ureq::Body;

use crate::sigv4::{self, Credentials, Signer, EMPTY_SHA256, UNSIGNED_PAYLOAD};

/// Timeout of one whole request (connect, send, receive).
pub const S3_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// The server answered with an error status (and S3's error XML).
    #[error("{op} {target}: HTTP {status} {code}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Status {
        op: &'static str,
        target: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{op} {target}: {source}")]
    Transport {
        op: &'static str,
        target: String,
        source: ureq::Error,
    },
    #[error("{op} {target}: {what}")]
    Protocol {
        op: &'static str,
        target: String,
        what: String,
    },
    #[error("{0}")]
    Config(String),
}

/// Where the S3 endpoint is and who we are; from flags or the AWS
/// environment variables (see [`S3Options`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    /// `http://host[:port]`, no trailing slash.
    pub endpoint: String,
    /// `host[:port]` as sent and signed in the Host header.
    pub host: String,
    pub region: String,
    pub creds: Credentials,
    /// Hash every body into the signature (as awscli does over plain HTTP)
    /// instead of sending `UNSIGNED-PAYLOAD`.
    pub sign_payload: bool,
}

/// S3 connection settings as given (flags, environment); resolved into an
/// [`S3Config`] when an `s3://` target is used.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct S3Options {
    /// S3 endpoint of s3:// targets, e.g. http://127.0.0.1:9000 (path-style requests).
    #[arg(long = "endpoint-url", env = "AWS_ENDPOINT_URL")]
    pub endpoint: Option<String>,
    /// Access key id of s3:// targets.
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    pub access_key: Option<String>,
    /// Secret access key of s3:// targets (better given in the environment).
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
    /// Region signed into s3:// requests [default: AWS_DEFAULT_REGION, else us-east-1].
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// Hash request bodies into the SigV4 signature instead of UNSIGNED-PAYLOAD.
    #[arg(long)]
    pub sign_payload: bool,
}

impl S3Options {
    /// The same settings from the environment alone.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            endpoint: var("AWS_ENDPOINT_URL"),
            access_key: var("AWS_ACCESS_KEY_ID"),
            secret_key: var("AWS_SECRET_ACCESS_KEY"),
            region: var("AWS_REGION"),
            sign_payload: false,
        }
    }

    pub fn resolve(&self) -> Result<S3Config, S3Error> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| var("AWS_ENDPOINT_URL_S3"))
            .ok_or_else(|| {
                S3Error::Config(
                    "no S3 endpoint: set AWS_ENDPOINT_URL or --endpoint-url (e.g. http://127.0.0.1:9000)"
                        .into(),
                )
            })?;
        let (endpoint, host) = parse_endpoint(&endpoint)?;
        let access_key = self.access_key.clone().ok_or_else(|| {
            S3Error::Config("no S3 access key: set AWS_ACCESS_KEY_ID or --access-key".into())
        })?;
        let secret_key = self.secret_key.clone().ok_or_else(|| {
            S3Error::Config("no S3 secret key: set AWS_SECRET_ACCESS_KEY or --secret-key".into())
        })?;
        let region = self
            .region
            .clone()
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        Ok(S3Config {
            endpoint,
            host,
            region,
            creds: Credentials {
                access_key,
                secret_key,
            },
            sign_payload: self.sign_payload,
        })
    }
}

/// `http://host[:port][/]` -> (`http://host[:port]`, `host[:port]`).
fn parse_endpoint(s: &str) -> Result<(String, String), S3Error> {
    let bad = |why: &str| S3Error::Config(format!("S3 endpoint {s:?}: {why}"));
    if s.starts_with("https://") {
        return Err(bad("TLS is not supported by the bench client; use http://"));
    }
    let rest = s
        .strip_prefix("http://")
        .ok_or_else(|| bad("expected http://host[:port]"))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') || host.contains('?') || host.contains('@') {
        return Err(bad("expected http://host[:port] without a path"));
    }
    Ok((format!("http://{host}"), host.to_string()))
}

/// One page of ListObjectsV2.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Keys and sizes, in the server's order.
    pub objects: Vec<(String, u64)>,
    /// The continuation token when the listing is truncated.
    pub next: Option<String>,
}

/// One client: one connection (kept alive between requests).
pub struct S3Client {
    agent: ureq::Agent,
    cfg: Arc<S3Config>,
    signer: Signer,
}

impl S3Client {
    pub fn new(cfg: Arc<S3Config>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(S3_TIMEOUT))
            .http_status_as_error(false)
            // Straight to the endpoint: a proxy from the environment would be measured too.
            .proxy(None)
            .max_idle_connections(1)
            .max_idle_connections_per_host(1)
            .build()
            .into();
        let signer = Signer::new(cfg.creds.clone(), &cfg.region, "s3");
        Self { agent, cfg, signer }
    }

    pub fn config(&self) -> &S3Config {
        &self.cfg
    }

    /// Sends one signed request; `key` None addresses the bucket.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        op: &'static str,
        method: &str,
        bucket: &str,
        key: Option<&str>,
        query: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response<Body>, S3Error> {
        let path = match key {
            Some(k) => format!("/{bucket}/{}", sigv4::uri_encode(k, true)),
            None => format!("/{bucket}"),
        };
        let target = format!("s3://{bucket}/{}", key.unwrap_or(""));
        let payload_hash = if body.is_empty() {
            EMPTY_SHA256.to_string()
        } else if self.cfg.sign_payload {
            sigv4::sha256_hex(body)
        } else {
            UNSIGNED_PAYLOAD.to_string()
        };
        let amz_date = crate::util::stamp(crate::util::unix_now());
        let headers = [
            ("host", self.cfg.host.as_str()),
            ("x-amz-content-sha256", payload_hash.as_str()),
            ("x-amz-date", amz_date.as_str()),
        ];
        let auth = self.signer.authorization(&sigv4::Request {
            method,
            path: &path,
            query,
            headers: &headers,
            payload_hash: &payload_hash,
            amz_date: &amz_date,
        });
        let q = sigv4::canonical_query(query);
        let uri = if q.is_empty() {
            format!("{}{path}", self.cfg.endpoint)
        } else {
            format!("{}{path}?{q}", self.cfg.endpoint)
        };
        let mut b = Request::builder().method(method).uri(&uri);
        for (k, v) in headers {
            b = b.header(k, v);
        }
        b = b.header("authorization", auth);
        let proto = |what: String| S3Error::Protocol {
            op,
            target: target.clone(),
            what,
        };
        // No body at all for GET/HEAD/DELETE; a PUT sends its length, even 0
        // (ureq would send an empty chunked body for `()`).
        let r = if body.is_empty() && method != "PUT" {
            let req = b.body(()).map_err(|e| proto(e.to_string()))?;
            self.agent.run(req)
        } else {
            let req = b.body(body).map_err(|e| proto(e.to_string()))?;
            self.agent.run(req)
        };
        let mut resp = r.map_err(|source| S3Error::Transport {
            op,
            target: target.clone(),
            source,
        })?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) || (method == "HEAD" && status == 404) {
            return Ok(resp);
        }
        // Read the error document (this also frees the connection).
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_string()
            .unwrap_or_default();
        Err(S3Error::Status {
            op,
            target,
            status,
            code: xml_value(&text, "Code").unwrap_or_else(|| {
                resp.status()
                    .canonical_reason()
                    .unwrap_or("error")
                    .to_string()
            }),
            message: xml_value(&text, "Message").unwrap_or_default(),
        })
    }

    /// Reads (and drops) the rest of a body so the connection can be reused.
    fn drain(op: &'static str, target: String, resp: Response<Body>) -> Result<(), S3Error> {
        let mut r = resp.into_body().into_reader();
        std::io::copy(&mut r, &mut std::io::sink()).map_err(|e| S3Error::Protocol {
            op,
            target,
            what: format!("reading the reply: {e}"),
        })?;
        Ok(())
    }

    pub fn put_object(&mut self, bucket: &str, key: &str, data: &[u8]) -> Result<(), S3Error> {
        let resp = self.send("PUT", "PUT", bucket, Some(key), &[], data)?;
        Self::drain("PUT", format!("s3://{bucket}/{key}"), resp)
    }

    /// GETs an object into `buf`; returns its length, an error if it does
    /// not fit.
    pub fn get_object(
        &mut self,
        bucket: &str,
        key: &str,
        buf: &mut [u8],
    ) -> Result<usize, S3Error> {
        let resp = self.send("GET", "GET", bucket, Some(key), &[], &[])?;
        let target = || format!("s3://{bucket}/{key}");
        let io = |e: std::io::Error| S3Error::Protocol {
            op: "GET",
            target: target(),
            what: format!("reading the body: {e}"),
        };
        let mut r = resp.into_body().into_reader();
        let mut n = 0;
        while n < buf.len() {
            match r.read(&mut buf[n..]).map_err(io)? {
                0 => return Ok(n),
                k => n += k,
            }
        }
        let mut extra = [0u8; 1];
        if r.read(&mut extra).map_err(io)? != 0 {
            return Err(S3Error::Protocol {
                op: "GET",
                target: target(),
                what: format!("the object is larger than {} bytes", buf.len()),
            });
        }
        Ok(n)
    }

    /// HEADs an object: its size, or None if there is no such key.
    pub fn head_object(&mut self, bucket: &str, key: &str) -> Result<Option<u64>, S3Error> {
        let resp = self.send("HEAD", "HEAD", bucket, Some(key), &[], &[])?;
        if resp.status().as_u16() == 404 {
            return Ok(None);
        }
        let len = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| S3Error::Protocol {
                op: "HEAD",
                target: format!("s3://{bucket}/{key}"),
                what: "no Content-Length in the reply".into(),
            })?;
        Ok(Some(len))
    }

    /// Whether the bucket exists and we may use it (HeadBucket); opens the
    /// connection the next requests reuse.
    pub fn head_bucket(&mut self, bucket: &str) -> Result<bool, S3Error> {
        match self.send("HeadBucket", "HEAD", bucket, None, &[], &[]) {
            Ok(resp) => Ok(resp.status().as_u16() != 404),
            // A HEAD error has no body to name its cause (a wrong key or
            // signature, a missing grant): a listing's error document does.
            Err(S3Error::Status { status: 403, .. }) => {
                self.list_objects_v2(bucket, "", None, 1)?;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    pub fn delete_object(&mut self, bucket: &str, key: &str) -> Result<(), S3Error> {
        let resp = self.send("DELETE", "DELETE", bucket, Some(key), &[], &[])?;
        Self::drain("DELETE", format!("s3://{bucket}/{key}"), resp)
    }

    /// Creates the bucket; one that exists and is ours already is fine.
    pub fn create_bucket(&mut self, bucket: &str) -> Result<(), S3Error> {
        match self.send("CreateBucket", "PUT", bucket, None, &[], &[]) {
            Ok(resp) => Self::drain("CreateBucket", format!("s3://{bucket}"), resp),
            Err(S3Error::Status { code, .. }) if code == "BucketAlreadyOwnedByYou" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One ListObjectsV2 page of up to `max_keys` keys under `prefix`.
    pub fn list_objects_v2(
        &mut self,
        bucket: &str,
        prefix: &str,
        token: Option<&str>,
        max_keys: u32,
    ) -> Result<ListPage, S3Error> {
        let mk = max_keys.to_string();
        let mut q: Vec<(&str, &str)> = vec![("list-type", "2"), ("max-keys", &mk)];
        if !prefix.is_empty() {
            q.push(("prefix", prefix));
        }
        if let Some(t) = token {
            q.push(("continuation-token", t));
        }
        let mut resp = self.send("ListObjectsV2", "GET", bucket, None, &q, &[])?;
        let target = format!("s3://{bucket}/{prefix}");
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|source| S3Error::Transport {
                op: "ListObjectsV2",
                target: target.clone(),
                source,
            })?;
        let mut page = ListPage::default();
        for c in xml_elements(&text, "Contents") {
            let key = xml_value(c, "Key").ok_or_else(|| S3Error::Protocol {
                op: "ListObjectsV2",
                target: target.clone(),
                what: "an entry without <Key>".into(),
            })?;
            let size = xml_value(c, "Size")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            page.objects.push((key, size));
        }
        if xml_value(&text, "IsTruncated").as_deref() == Some("true") {
            let next =
                xml_value(&text, "NextContinuationToken").ok_or_else(|| S3Error::Protocol {
                    op: "ListObjectsV2",
                    target: target.clone(),
                    what: "truncated listing without NextContinuationToken".into(),
                })?;
            page.next = Some(next);
        }
        Ok(page)
    }
}

/// The raw contents of every `<tag>...</tag>` element (not nested in itself).
fn xml_elements<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        match rest.find(&close) {
            Some(j) => {
                out.push(&rest[..j]);
                rest = &rest[j + close.len()..];
            }
            None => break,
        }
    }
    out
}

/// The text of the first `<tag>` element, entities decoded.
fn xml_value(text: &str, tag: &str) -> Option<String> {
    xml_elements(text, tag).first().map(|v| xml_unescape(v))
}

fn xml_unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let end = rest.find(';').unwrap_or(0);
        let ent = &rest[1..end.max(1)];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) if end > 0 => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:9000/").unwrap(),
            ("http://127.0.0.1:9000".into(), "127.0.0.1:9000".into())
        );
        assert!(parse_endpoint("https://s3.example")
            .unwrap_err()
            .to_string()
            .contains("TLS"));
        assert!(parse_endpoint("127.0.0.1:9000").is_err());
        assert!(parse_endpoint("http://h/path").is_err());
        let o = S3Options {
            endpoint: Some("http://h:1".into()),
            access_key: Some("a".into()),
            secret_key: None,
            region: Some("r".into()),
            sign_payload: false,
        };
        if std::env::var_os("AWS_SECRET_ACCESS_KEY").is_none() {
            assert!(o.resolve().unwrap_err().to_string().contains("secret"));
        }
        let o = S3Options {
            secret_key: Some("s".into()),
            ..o
        };
        let c = o.resolve().unwrap();
        assert_eq!((c.host.as_str(), c.region.as_str()), ("h:1", "r"));
        assert!(!format!("{c:?}").contains("\"s\""), "secret hidden");
    }

    #[test]
    fn parses_list_and_error_documents() {
        let page = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>
<Contents><Key>a&amp;b</Key><Size>4096</Size></Contents>
<Contents><Key>c&#x3c;</Key><Size>7</Size></Contents>
<IsTruncated>true</IsTruncated><NextContinuationToken>x+/=&amp;</NextContinuationToken></ListBucketResult>"#;
        let cs = xml_elements(page, "Contents");
        assert_eq!(cs.len(), 2);
        assert_eq!(xml_value(cs[0], "Key").unwrap(), "a&b");
        assert_eq!(xml_value(cs[1], "Key").unwrap(), "c<");
        assert_eq!(xml_value(page, "NextContinuationToken").unwrap(), "x+/=&");
        assert_eq!(xml_unescape("a & b &bogus; &amp"), "a & b &bogus; &amp");
        let err = "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
        assert_eq!(xml_value(err, "Code").unwrap(), "NoSuchBucket");
    }
}
