//! Byte sizes on the command line: 4096, 64K, 8M, 2G, 1T (powers of 1024).

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        Some('T') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let value: u64 = digits.parse().map_err(|_| format!("'{text}' is not a size (examples: 4096, 64K, 8M, 2G, 1T)"))?;
    value.checked_shl(shift).filter(|v| v >> shift == value).ok_or_else(|| format!("'{text}' is too large"))
}

pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
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
    fn parses_sizes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("99999999999999999T").is_err());
        assert_eq!(format_bytes(3 << 20), "3.0 MiB");
    }
}
