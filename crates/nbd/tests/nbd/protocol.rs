//! Property tests of the pure wire format: decoders never panic on arbitrary
//! bytes, and every encoder round-trips through its decoder.

use duplex_nbd::protocol::*;
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Valid NBD strings: short, no NUL.
fn nbd_string() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,40}"
}

proptest! {
    #[test]
    fn decoders_never_panic(data in bytes(96), option in any::<u32>()) {
        let _ = decode_greeting(&data);
        let _ = decode_client_flags(&data);
        let _ = decode_option_header(&data);
        let _ = decode_option(option, &data);
        let _ = decode_option_reply_header(&data);
        let _ = decode_info(&data);
        let _ = decode_server_entry(&data);
        let _ = decode_request(&data);
        let _ = decode_simple_reply_header(&data);
    }

    #[test]
    fn known_options_with_arbitrary_data_never_panic(option in 0u32..12, data in bytes(64)) {
        match decode_option(option, &data) {
            Ok(ClientOption::Info(request) | ClientOption::Go(request)) => {
                // Anything accepted must account for every byte of the data.
                prop_assert_eq!(6 + request.name.len() + 2 * request.info_types.len(), data.len());
            }
            Ok(ClientOption::List) => prop_assert!(data.is_empty()),
            Ok(ClientOption::ExportName(name)) => prop_assert_eq!(name.as_bytes(), &data[..]),
            _ => {}
        }
    }

    #[test]
    fn requests_round_trip(flags: u16, command: u16, handle: u64, offset: u64, length: u32) {
        let request = Request { flags, command, handle, offset, length };
        let encoded = encode_request(&request);
        prop_assert_eq!(encoded.len(), REQUEST_LEN);
        prop_assert_eq!(decode_request(&encoded), Ok(request));
        // Any corruption of the magic is detected; truncation too.
        let mut corrupted = encoded;
        corrupted[(handle % 4) as usize] ^= 1 << (offset % 8);
        let corrupted_is_bad_magic = matches!(decode_request(&corrupted), Err(DecodeError::BadMagic { .. }));
        prop_assert!(corrupted_is_bad_magic);
        let truncated_is_short = matches!(decode_request(&encoded[..REQUEST_LEN - 1]), Err(DecodeError::Short { .. }));
        prop_assert!(truncated_is_short);
    }

    #[test]
    fn simple_reply_headers_round_trip(error: u32, handle: u64) {
        let header = SimpleReplyHeader { error, handle };
        prop_assert_eq!(decode_simple_reply_header(&encode_simple_reply_header(&header)), Ok(header));
    }

    #[test]
    fn option_headers_round_trip(option: u32, length: u32) {
        let header = OptionHeader { option, length };
        prop_assert_eq!(decode_option_header(&encode_option_header(&header)), Ok(header));
    }

    #[test]
    fn options_round_trip(name in nbd_string(), info_types in proptest::collection::vec(any::<u16>(), 0..8), which in 0u8..4) {
        let request = InfoRequest { name: name.clone(), info_types };
        let option = match which {
            0 => ClientOption::ExportName(name),
            1 => ClientOption::Info(request),
            2 => ClientOption::Go(request),
            _ => ClientOption::List,
        };
        let (code, data) = encode_option(&option);
        prop_assert_eq!(decode_option(code, &data), Ok(option));
    }

    #[test]
    fn option_replies_round_trip(option: u32, reply_type: u32, data in bytes(64)) {
        let mut encoded = Vec::new();
        encode_option_reply(option, reply_type, &data, &mut encoded);
        let header = decode_option_reply_header(&encoded[..OPTION_REPLY_HEADER_LEN]).unwrap();
        prop_assert_eq!(header, OptionReplyHeader { option, reply_type, length: data.len() as u32 });
        prop_assert_eq!(&encoded[OPTION_REPLY_HEADER_LEN..], &data[..]);
    }

    #[test]
    fn infos_round_trip(size: u64, flags: u16, text in nbd_string(), minimum: u32, preferred: u32, maximum: u32) {
        for info in [
            Info::Export { size, transmission_flags: flags },
            Info::Name(text.clone()),
            Info::Description(text.clone()),
            Info::BlockSize { minimum, preferred, maximum },
            Info::Unknown(flags.max(4)),
        ] {
            prop_assert_eq!(decode_info(&encode_info(&info)), Ok(info));
        }
    }

    #[test]
    fn server_entries_round_trip(name in nbd_string(), description in nbd_string()) {
        let encoded = encode_server_entry(&name, Some(&description));
        prop_assert_eq!(decode_server_entry(&encoded), Ok((name, description)));
    }

    #[test]
    fn greeting_round_trips(flags: u16) {
        prop_assert_eq!(decode_greeting(&encode_greeting(flags)), Ok(flags));
    }

    #[test]
    fn export_name_reply_has_the_spec_layout(size: u64, flags: u16, no_zeroes: bool) {
        let reply = encode_export_name_reply(size, flags, no_zeroes);
        prop_assert_eq!(reply.len(), if no_zeroes { 10 } else { 134 });
        prop_assert_eq!(&reply[..8], &size.to_be_bytes());
        prop_assert_eq!(&reply[8..10], &flags.to_be_bytes());
        prop_assert!(reply[10..].iter().all(|&byte| byte == 0));
    }
}

#[test]
fn constants_match_the_spec() {
    assert_eq!(&NBD_MAGIC.to_be_bytes(), b"NBDMAGIC");
    assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    assert_eq!(OPTION_REPLY_MAGIC, 0x3e889045565a9);
    assert_eq!((REQUEST_MAGIC, SIMPLE_REPLY_MAGIC), (0x25609513, 0x67446698));
    assert_eq!((OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_INFO, OPT_GO), (1, 2, 3, 6, 7));
    assert_eq!((REP_ERR_UNSUP, REP_ERR_INVALID, REP_ERR_UNKNOWN), (0x8000_0001, 0x8000_0003, 0x8000_0006));
    assert_eq!((INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE), (0, 1, 2, 3));
    assert_eq!(
        (CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES),
        (0, 1, 2, 3, 4, 5, 6)
    );
    assert_eq!((FLAG_SEND_TRIM, FLAG_SEND_WRITE_ZEROES, FLAG_CAN_MULTI_CONN), (32, 64, 256));
}

#[test]
fn errno_codes_are_the_nbd_numbers() {
    use duplex_nbd::Errno;
    let all = [
        (Errno::Perm, 1),
        (Errno::Io, 5),
        (Errno::NoMem, 12),
        (Errno::Inval, 22),
        (Errno::NoSpc, 28),
        (Errno::Overflow, 75),
        (Errno::NotSup, 95),
        (Errno::Shutdown, 108),
    ];
    for (errno, code) in all {
        assert_eq!(errno.code(), code);
        assert_eq!(Errno::from_code(code), Some(errno));
    }
    assert_eq!(Errno::from_code(0), None);
    assert_eq!(Errno::from(std::io::Error::from_raw_os_error(libc::EDQUOT)), Errno::NoSpc);
    assert_eq!(Errno::from(std::io::Error::from_raw_os_error(libc::EACCES)), Errno::Perm);
    assert_eq!(Errno::from(std::io::Error::other("x")), Errno::Io);
}
