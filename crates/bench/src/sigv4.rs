//! AWS Signature Version 4 in its header form (`Authorization: AWS4-HMAC-SHA256 ...`),
//! as the S3 clients send it: canonical request, string to sign, the
//! derived signing key and the signature. Checked against the examples of
//! the AWS documentation (tests below).

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// SHA-256 of the empty string: the payload hash of GET, HEAD and DELETE.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// `x-amz-content-sha256` of a body that is not hashed into the signature.
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// An access key and its secret. Debug never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .finish()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length: new_from_slice cannot fail here.
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(msg);
    m.finalize().into_bytes().into()
}

/// S3's URI encoding: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX`
/// (upper-case hex); `/` kept when `keep_slash` (object keys in the path).
pub fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The query string as signed and sent: names and values URI-encoded,
/// sorted by name then value, joined with `&`.
pub fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut q: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    q.sort();
    q.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")`.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// One request to sign. `path` is the canonical (already encoded) URI,
/// `headers` the signed headers with lower-case names (host, x-amz-date and
/// x-amz-content-sha256 among them), `amz_date` as `20130524T000000Z`.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a [(&'a str, &'a str)],
    pub headers: &'a [(&'a str, &'a str)],
    pub payload_hash: &'a str,
    pub amz_date: &'a str,
}

impl Request<'_> {
    fn sorted_headers(&self) -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| {
                // Values trimmed, inner runs of spaces folded to one.
                let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
                (k.to_ascii_lowercase(), v)
            })
            .collect();
        h.sort();
        h
    }

    pub fn signed_headers(&self) -> String {
        self.sorted_headers()
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(";")
    }

    pub fn canonical_request(&self) -> String {
        let headers: String = self
            .sorted_headers()
            .iter()
            .map(|(k, v)| format!("{k}:{v}\n"))
            .collect();
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.method,
            self.path,
            canonical_query(self.query),
            headers,
            self.signed_headers(),
            self.payload_hash
        )
    }

    pub fn string_to_sign(&self, scope: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
            self.amz_date,
            sha256_hex(self.canonical_request().as_bytes())
        )
    }
}

/// Signs requests; keeps the day's signing key (it changes once a day).
#[derive(Debug, Clone)]
pub struct Signer {
    creds: Credentials,
    region: String,
    service: String,
    key: Option<(String, [u8; 32])>,
}

impl Signer {
    pub fn new(creds: Credentials, region: &str, service: &str) -> Self {
        Self {
            creds,
            region: region.to_string(),
            service: service.to_string(),
            key: None,
        }
    }

    /// The `Authorization` header value of `req`.
    pub fn authorization(&mut self, req: &Request<'_>) -> String {
        let date = &req.amz_date[..8.min(req.amz_date.len())];
        let scope = format!("{date}/{}/{}/aws4_request", self.region, self.service);
        let key = match &self.key {
            Some((d, k)) if d == date => *k,
            _ => {
                let k = signing_key(&self.creds.secret_key, date, &self.region, &self.service);
                self.key = Some((date.to_string(), k));
                k
            }
        };
        let signature = hex(&hmac(&key, req.string_to_sign(&scope).as_bytes()));
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={}, Signature={signature}",
            self.creds.access_key,
            req.signed_headers()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example credentials of the AWS documentation.
    const AK: &str = "AKIAIOSFODNN7EXAMPLE";
    const SK: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn signer() -> Signer {
        Signer::new(
            Credentials {
                access_key: AK.into(),
                secret_key: SK.into(),
            },
            "us-east-1",
            "s3",
        )
    }

    fn signature(auth: &str) -> &str {
        auth.rsplit("Signature=").next().unwrap()
    }

    #[test]
    fn derived_signing_key_of_the_aws_docs() {
        // "Examples of how to derive a signing key for Signature Version 4"
        let k = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex(&k),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn s3_get_object_example() {
        // S3 API reference, "Signature Calculations for the Authorization
        // Header": GET Object with a Range header.
        let req = Request {
            method: "GET",
            path: "/test.txt",
            query: &[],
            headers: &[
                ("host", "examplebucket.s3.amazonaws.com"),
                ("range", "bytes=0-9"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_hash: EMPTY_SHA256,
            amz_date: "20130524T000000Z",
        };
        assert_eq!(
            req.canonical_request(),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n\
             x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
             x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(req.canonical_request().as_bytes()),
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
        );
        let auth = signer().authorization(&req);
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn s3_put_object_example() {
        // PUT Object of "Welcome to Amazon S3." with a storage class header;
        // the key "test$file.text" is URI-encoded in the canonical request.
        let body = b"Welcome to Amazon S3.";
        let hash = sha256_hex(body);
        assert_eq!(
            hash,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
        );
        let path = format!("/{}", uri_encode("test$file.text", true));
        assert_eq!(path, "/test%24file.text");
        let req = Request {
            method: "PUT",
            path: &path,
            query: &[],
            headers: &[
                ("Host", "examplebucket.s3.amazonaws.com"),
                ("Date", "Fri, 24 May 2013 00:00:00 GMT"),
                ("x-amz-date", "20130524T000000Z"),
                ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
                ("x-amz-content-sha256", &hash),
            ],
            payload_hash: &hash,
            amz_date: "20130524T000000Z",
        };
        assert_eq!(
            signature(&signer().authorization(&req)),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
        );
    }

    #[test]
    fn s3_list_objects_example() {
        // GET Bucket (List Objects) with max-keys=2&prefix=J: the query is
        // sorted and encoded in the canonical request.
        let req = Request {
            method: "GET",
            path: "/",
            query: &[("prefix", "J"), ("max-keys", "2")],
            headers: &[
                ("host", "examplebucket.s3.amazonaws.com"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_hash: EMPTY_SHA256,
            amz_date: "20130524T000000Z",
        };
        assert!(req.canonical_request().contains("\nmax-keys=2&prefix=J\n"));
        assert_eq!(
            signature(&signer().authorization(&req)),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        );
    }

    #[test]
    fn lifecycle_get_example_and_key_cache() {
        // GET Bucket Lifecycle: a query parameter without a value.
        let req = Request {
            method: "GET",
            path: "/",
            query: &[("lifecycle", "")],
            headers: &[
                ("host", "examplebucket.s3.amazonaws.com"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_hash: EMPTY_SHA256,
            amz_date: "20130524T000000Z",
        };
        let mut s = signer();
        let a = s.authorization(&req);
        assert_eq!(
            signature(&a),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"
        );
        // The cached key of the day gives the same signature; another day another.
        assert_eq!(s.authorization(&req), a);
        let other = Request {
            amz_date: "20130525T000000Z",
            ..req
        };
        assert_ne!(signature(&s.authorization(&other)), signature(&a));
    }

    #[test]
    fn encoding_rules() {
        assert_eq!(uri_encode("a b+c/d~e", true), "a%20b%2Bc/d~e");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
        assert_eq!(uri_encode("é", false), "%C3%A9");
        assert_eq!(
            canonical_query(&[("b", "2"), ("a", "x y"), ("a", "1")]),
            "a=1&a=x%20y&b=2"
        );
    }
}
