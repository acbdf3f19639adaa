//! Entry points for the fuzz targets (`fuzz/`, decision 0027); not part of
//! the API. Decodes what a client sends without a socket or a pool: the
//! record marking ([`rpc::read_record`]), the call header ([`rpc::Call::parse`]),
//! the arguments of each procedure the server answers (the types `proc.rs`
//! decodes them into), and file handles.

use crate::proc::parse_fh;
use crate::rpc::{self, Call, RpcError};
use nfs3_types::mount::dirpath;
use nfs3_types::nfs3::*;
use nfs3_types::portmap;
use nfs3_types::xdr_codec::{Pack, Unpack, Void};
use std::cell::RefCell;
use std::io::Cursor;

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// Splits `stream` into RPC records as the server reads them from a
/// connection (at most `limit` records).
pub fn records(stream: &[u8], limit: usize) -> (Vec<Vec<u8>>, Option<RpcError>) {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime builds")
        });
        rt.block_on(async {
            let mut input = stream;
            let mut out = Vec::new();
            for _ in 0..limit {
                let mut buf = Vec::new();
                match rpc::read_record(&mut input, &mut buf).await {
                    Ok(()) => out.push(buf),
                    Err(RpcError::Closed) => return (out, None),
                    Err(e) => return (out, Some(e)),
                }
            }
            (out, None)
        })
    })
}

/// What a decoded call held.
#[derive(Debug)]
pub struct Decoded {
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    /// The arguments re-encoded (`None`: a procedure the server does not
    /// have; `Some(Err)`: arguments the server answers with GARBAGE_ARGS).
    pub args: Option<Result<Vec<u8>, String>>,
    /// The file handles among the arguments, decoded.
    pub handles: Vec<Result<[u64; 4], nfsstat3>>,
}

/// Decodes `args` as `T`; re-encodes it and checks that decoding the
/// encoding gives the same bytes again (decode(encode(x)) == x on the wire).
fn args<T: Unpack + Pack>(call: &mut Call, fhs: impl Fn(&T) -> Vec<&nfs_fh3>) -> Decoded {
    let mut d = Decoded {
        prog: call.prog,
        vers: call.vers,
        proc_: call.proc_,
        args: None,
        handles: Vec::new(),
    };
    let v: T = match call.args() {
        Ok(v) => v,
        Err(e) => {
            d.args = Some(Err(e));
            return d;
        }
    };
    d.handles = fhs(&v).into_iter().map(|h| parse_fh(&h.data)).collect();
    let mut once = Vec::new();
    // Some decoded values have no encoding (MKNOD of a regular file type
    // decodes to `mknoddata3::default`, which the server answers BADTYPE).
    if v.pack(&mut once).is_err() {
        d.args = Some(Ok(Vec::new()));
        return d;
    }
    assert_eq!(once.len(), v.packed_size(), "packed_size");
    let (again, n) = T::unpack(&mut Cursor::new(&once[..])).expect("encoded arguments decode");
    assert_eq!(n, once.len(), "decoding an encoding uses all of it");
    let mut twice = Vec::new();
    again.pack(&mut twice).expect("decoded arguments encode");
    assert_eq!(once, twice, "decode(encode(x)) != x");
    d.args = Some(Ok(once));
    d
}

fn none<T>(_: &T) -> Vec<&nfs_fh3> {
    Vec::new()
}

/// Decodes one RPC record as the server does: the call header, then the
/// arguments of the procedure it names (the same types `proc::dispatch`
/// decodes them into). `Err`: a record the server drops as garbage.
pub fn call(record: &[u8]) -> Result<Decoded, RpcError> {
    let mut c = Call::parse(record.to_vec())?;
    let (prog, vers, p) = (c.prog, c.vers, c.proc_);
    let c = &mut c;
    Ok(match (prog, vers, p) {
        (portmap::PROGRAM, portmap::VERSION, 0) => args::<Void>(c, none),
        (portmap::PROGRAM, portmap::VERSION, 3) => args::<portmap::mapping>(c, none),
        (nfs3_types::mount::PROGRAM, nfs3_types::mount::VERSION, 1 | 2) => {
            args::<dirpath<'static>>(c, none)
        }
        (nfs3_types::mount::PROGRAM, nfs3_types::mount::VERSION, 0 | 3 | 4 | 5) => {
            args::<Void>(c, none)
        }
        (PROGRAM, VERSION, p) => match p {
            0 => args::<Void>(c, none),
            1 => args::<GETATTR3args>(c, |a| vec![&a.object]),
            2 => args::<SETATTR3args>(c, |a| vec![&a.object]),
            3 => args::<LOOKUP3args<'static>>(c, |a| vec![&a.what.dir]),
            4 => args::<ACCESS3args>(c, |a| vec![&a.object]),
            5 => args::<READLINK3args>(c, |a| vec![&a.symlink]),
            6 => args::<READ3args>(c, |a| vec![&a.file]),
            7 => args::<WRITE3args<'static>>(c, |a| vec![&a.file]),
            8 => args::<CREATE3args<'static>>(c, |a| vec![&a.where_.dir]),
            9 => args::<MKDIR3args<'static>>(c, |a| vec![&a.where_.dir]),
            10 => args::<SYMLINK3args<'static>>(c, |a| vec![&a.where_.dir]),
            11 => args::<MKNOD3args<'static>>(c, |a| vec![&a.where_.dir]),
            12 => args::<REMOVE3args<'static>>(c, |a| vec![&a.object.dir]),
            13 => args::<RMDIR3args<'static>>(c, |a| vec![&a.object.dir]),
            14 => args::<RENAME3args<'static, 'static>>(c, |a| vec![&a.from.dir, &a.to.dir]),
            15 => args::<LINK3args<'static>>(c, |a| vec![&a.file, &a.link.dir]),
            16 => args::<READDIR3args>(c, |a| vec![&a.dir]),
            17 => args::<READDIRPLUS3args>(c, |a| vec![&a.dir]),
            18 => args::<FSSTAT3args>(c, |a| vec![&a.fsroot]),
            19 => args::<FSINFO3args>(c, |a| vec![&a.fsroot]),
            20 => args::<PATHCONF3args>(c, |a| vec![&a.object]),
            21 => args::<COMMIT3args>(c, |a| vec![&a.file]),
            _ => unknown(c),
        },
        _ => unknown(c),
    })
}

fn unknown(c: &Call) -> Decoded {
    Decoded {
        prog: c.prog,
        vers: c.vers,
        proc_: c.proc_,
        args: None,
        handles: Vec::new(),
    }
}

/// A file handle as the server makes them (for seeds and tests).
pub fn handle(pool_guid: u64, dataset: u64, ino: u64, generation: u64) -> nfs_fh3 {
    crate::proc::fh_of(pool_guid, dataset, ino, generation)
}
