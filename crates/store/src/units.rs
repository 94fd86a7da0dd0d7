//! Byte sizes as operators write them ("4096", "4k", "10G", "1.5T") and as
//! the tools print them; shared by `duplex` and `duplex-store`.

/// Parses a byte count: a number with an optional binary suffix (k, M, G,
/// T; "KiB", "MB" and friends are read as the same powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("'{text}' is not a size (try 4096, 4k, 10G)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        other => return Err(format!("'{text}' is not a size: unknown size suffix '{other}' (use k, M, G or T)")),
    };
    let bytes = number * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// "4.0 GiB", "512 B".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999999999T").is_err());
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4 << 30), "4.0 GiB");
    }
}
