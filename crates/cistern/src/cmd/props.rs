//! Property names as the zfs tools accept them (abbreviations, headers) and
//! values the CLI normalizes before sending.

use crate::format::parse_size;
use anyhow::Result;

/// The full name of a property given as an abbreviation (`avail` -> `available`).
pub fn canonical(name: &str) -> String {
    // User properties (`module:name`) are taken as written: zfs wants them lower-case.
    if name.contains(':') {
        return name.trim().to_string();
    }
    let lower = name.trim().to_ascii_lowercase();
    let full = match lower.as_str() {
        "avail" => "available",
        "refer" => "referenced",
        "lused" => "logicalused",
        "lrefer" => "logicalreferenced",
        "compress" => "compression",
        "ratio" => "compressratio",
        "refratio" => "refcompressratio",
        "volblock" => "volblocksize",
        "reserv" => "reservation",
        "refreserv" => "refreservation",
        "recsize" => "recordsize",
        "rdonly" => "readonly",
        "usedsnap" => "usedbysnapshots",
        "usedds" => "usedbydataset",
        "usedrefreserv" => "usedbyrefreservation",
        "usedchild" => "usedbychildren",
        _ => return lower,
    };
    full.to_string()
}

/// Column header for a property (zfs list style).
pub fn header(name: &str) -> String {
    match canonical(name).as_str() {
        "available" => "AVAIL".into(),
        "referenced" => "REFER".into(),
        "logicalused" => "LUSED".into(),
        "logicalreferenced" => "LREFER".into(),
        "compressratio" => "RATIO".into(),
        "refcompressratio" => "REFRATIO".into(),
        "compression" => "COMPRESS".into(),
        "volblocksize" => "VOLBLOCK".into(),
        "reservation" => "RESERV".into(),
        "refreservation" => "REFRESERV".into(),
        "recordsize" => "RECSIZE".into(),
        "readonly" => "RDONLY".into(),
        "usedbysnapshots" => "USEDSNAP".into(),
        "usedbydataset" => "USEDDS".into(),
        "usedbyrefreservation" => "USEDREFRESERV".into(),
        "usedbychildren" => "USEDCHILD".into(),
        other => other.to_uppercase(),
    }
}

/// Whether a column holds a number (right-aligned).
pub fn is_numeric(name: &str) -> bool {
    matches!(
        canonical(name).as_str(),
        "used"
            | "available"
            | "referenced"
            | "logicalused"
            | "logicalreferenced"
            | "compressratio"
            | "refcompressratio"
            | "volsize"
            | "volblocksize"
            | "quota"
            | "refquota"
            | "reservation"
            | "refreservation"
            | "recordsize"
            | "written"
            | "usedbydataset"
            | "usedbychildren"
            | "usedbysnapshots"
            | "usedbyrefreservation"
            | "createtxg"
            | "userrefs"
    )
}

/// Properties whose values are sizes; the CLI sends them as exact bytes.
fn is_size_property(name: &str) -> bool {
    matches!(
        name,
        "volsize"
            | "volblocksize"
            | "recordsize"
            | "quota"
            | "refquota"
            | "reservation"
            | "refreservation"
    )
}

/// Parses `prop=value`, canonicalizing the name and turning size values
/// (`16K`) into bytes (`16384`); `none`/`auto` pass through.
pub fn parse_assignment(s: &str) -> Result<(String, String)> {
    let Some((k, v)) = s.split_once('=') else {
        anyhow::bail!("'{s}' is not PROPERTY=VALUE");
    };
    let k = canonical(k);
    if k.is_empty() {
        anyhow::bail!("'{s}' has no property name");
    }
    Ok((k.clone(), normalize_value(&k, v)?))
}

pub fn normalize_value(prop: &str, value: &str) -> Result<String> {
    let v = value.trim();
    if is_size_property(prop) && !matches!(v.to_ascii_lowercase().as_str(), "none" | "auto") {
        let n = parse_size(v).map_err(|e| anyhow::anyhow!("bad value for {prop}: {e}"))?;
        return Ok(n.to_string());
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonicalizes_abbreviations() {
        assert_eq!(canonical("avail"), "available");
        assert_eq!(canonical("REFER"), "referenced");
        assert_eq!(canonical("compress"), "compression");
        assert_eq!(canonical("used"), "used");
        assert_eq!(header("available"), "AVAIL");
        assert_eq!(header("used"), "USED");
        assert_eq!(header("checksum"), "CHECKSUM");
    }

    #[test]
    fn parses_assignments() {
        assert_eq!(
            parse_assignment("compress=lz4").unwrap(),
            ("compression".into(), "lz4".into())
        );
        assert_eq!(
            parse_assignment("volblocksize=16K").unwrap(),
            ("volblocksize".into(), "16384".into())
        );
        assert_eq!(
            parse_assignment("volsize=1.5G").unwrap(),
            ("volsize".into(), (3u64 << 29).to_string())
        );
        assert_eq!(
            parse_assignment("quota=none").unwrap(),
            ("quota".into(), "none".into())
        );
        assert_eq!(
            parse_assignment("comment=a=b").unwrap(),
            ("comment".into(), "a=b".into())
        );
        assert!(parse_assignment("compression").is_err());
        assert!(parse_assignment("=lz4").is_err());
        let e = parse_assignment("volsize=12Q").unwrap_err();
        assert!(format!("{e:#}").contains("'12Q'"), "{e:#}");
    }
}
