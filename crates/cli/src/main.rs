//! `duplex`: the command line for Duplex clusters.

/// `println!` for this binary: when standard output is closed (`duplex
/// status | head -3`), the command ends quietly, as Unix tools do, instead
/// of panicking. Defined before the modules so that it is the one they use.
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(err) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(err);
        }
    }};
}

mod admin;
mod asok;
mod bench;
mod daemons;
mod dedup;
mod dev;
mod df;
mod diff;
mod nbd;
mod progress;
mod snap;
mod transfer;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use duplex_client::{Client, ClientConfig, ClientError, CreateOptions};

/// Counts allocations for the OSD's metrics (the per-write budget test reads them).
#[global_allocator]
static ALLOCATOR: duplex_osd::metrics::alloc_count::CountingAllocator =
    duplex_osd::metrics::alloc_count::CountingAllocator;

const DEFAULT_DIR: &str = "duplex-dev";

#[derive(Parser)]
#[command(
    name = "duplex",
    version,
    about = "Duplex: distributed block storage. Start a local cluster with `duplex dev up`.",
    after_help = "Clients find the cluster through --conf, else $DUPLEX_CONF, else ./duplex-dev/client.toml."
)]
struct Cli {
    /// Client configuration file (written by `duplex dev up` as DIR/client.toml).
    #[arg(long, global = true, env = "DUPLEX_CONF")]
    conf: Option<PathBuf>,
    /// The pool to work in.
    #[arg(long, global = true, default_value = "rbd")]
    pool: String,
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// A local cluster for development and trials.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Pools: create, list, delete.
    #[command(subcommand)]
    Pool(admin::PoolCommand),
    /// The deduplication tier: status, run, pause, scrub (docs/DEDUP.md).
    #[command(subcommand)]
    Dedup(dedup::DedupCommand),
    /// Block images: create, list, info, resize, remove.
    #[command(subcommand)]
    Image(admin::ImageCommand),
    /// Snapshots of images: create, list, remove, rollback, protect.
    #[command(subcommand)]
    Snap(snap::SnapCommand),
    /// Export images over NBD.
    #[command(subcommand)]
    Nbd(NbdCommand),
    /// Placement groups: deep scrub and repair.
    #[command(subcommand)]
    Pg(admin::PgCommand),
    /// Mark OSDs out, in, or lost (operator decisions the monitor records).
    #[command(subcommand)]
    Mark(admin::MarkCommand),
    /// Cluster settings the monitors keep in the map.
    #[command(subcommand)]
    Config(admin::ConfigCommand),
    /// OSDs up/in, PG states, capacity and client I/O.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Raw and per-pool space: used, stored, available after replication,
    /// and what thin images promise (as `ceph df`).
    Df {
        #[arg(long)]
        json: bool,
    },
    /// Measure an image or the pool's objects.
    Bench(bench::BenchArgs),
    /// Ask one daemon on this host through its admin socket (an OSD's is
    /// admin.sock in its --oplog-dir unless --admin-socket says otherwise).
    Daemon {
        /// The daemon's admin socket.
        socket: PathBuf,
        #[command(subcommand)]
        command: asok::DaemonCommand,
    },
    /// Run a monitor daemon (flags as `duplex mon --help`).
    #[command(disable_help_flag = true)]
    Mon {
        /// A TOML file of flags (keys are the long flag names).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Run an OSD daemon (flags as `duplex osd --help`).
    #[command(disable_help_flag = true)]
    Osd {
        /// A TOML file of flags (keys are the long flag names).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Start a monitor and OSDs in the background under DIR and create a pool.
    Up {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        #[command(flatten)]
        args: dev::UpArgs,
    },
    /// Stop the processes `dev up` started (and, with --wipe, delete their data).
    Down {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// Also delete the directory and the operation logs.
        #[arg(long)]
        wipe: bool,
    },
    /// Restart every OSD of a running dev cluster, keeping its data (e.g. to
    /// change a setting with --osd-set KEY=VALUE). For an idle cluster.
    Restart {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// An OSD setting to change, as KEY=VALUE (a `duplex osd` flag name; repeatable).
        #[arg(long = "osd-set", value_name = "KEY=VALUE")]
        osd_settings: Vec<String>,
        /// Restart only this OSD (repeatable); a killed one is started again.
        #[arg(long = "osd", value_name = "ID")]
        only: Vec<u32>,
    },
    /// Add an OSD to a running dev cluster (configured like osd.0); its PGs
    /// are backfilled while clients go on.
    AddOsd {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
    /// The tour: bring a cluster up (if none runs), create an image, benchmark
    /// it with random writes then reads, print the results. Leaves the cluster running.
    Demo {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// Seconds per benchmark phase.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Size of the demo image.
        #[arg(long, default_value = "1G", value_parser = duplex_store::units::parse_size)]
        image_size: u64,
        #[command(flatten)]
        up: dev::UpArgs,
    },
}

#[derive(Subcommand)]
enum NbdCommand {
    /// Serve one image over NBD until interrupted.
    Serve(nbd::ServeArgs),
}

fn main() {
    let cli = Cli::parse();
    let daemon = matches!(cli.command, Top::Mon { .. } | Top::Osd { .. });
    if !matches!(cli.command, Top::Osd { .. }) {
        // The OSD sets up its own logging.
        let default = if daemon { "info" } else { "warn" };
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into()))
            .with_writer(std::io::stderr)
            // Colours only on a terminal: a log file must not fill with escape codes.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    if let Err(err) = run(cli) {
        eprintln!("error: {err:#}");
        if let Some(hint) = hint(&err) {
            eprintln!("hint: {hint}");
        }
        std::process::exit(1);
    }
}

/// Standard output could not be written: a closed pipe ends the command
/// quietly (its reader has what it wanted); anything else is an error.
fn stdout_failed(err: std::io::Error) -> ! {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to standard output: {err}");
    std::process::exit(1)
}

/// Standard output for the bulk exports (`image export IMAGE -`,
/// `export-diff … -`): a reader that stops reading (`| head -c 100`) ends
/// the command quietly, as `println!` does here, not with an error.
pub(crate) struct QuietStdout(std::io::StdoutLock<'static>);

impl QuietStdout {
    pub(crate) fn lock() -> QuietStdout {
        QuietStdout(std::io::stdout().lock())
    }
}

impl std::io::Write for QuietStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(quiet_on_closed_pipe)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(quiet_on_closed_pipe)
    }
}

/// A closed pipe ends the command (quietly); other errors go on up.
fn quiet_on_closed_pipe(err: std::io::Error) -> std::io::Error {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        stdout_failed(err);
    }
    err
}

/// What to do about the errors people meet most.
fn hint(err: &anyhow::Error) -> Option<&'static str> {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::NoSuchPool(_)) => {
            Some("list pools with `duplex pool list`; create one with `duplex pool create NAME`")
        }
        Some(ClientError::NoSpace(_)) => Some(
            "an OSD of the PG is full: delete images or objects (deletes, discards and `duplex image remove` still \
             work), add OSDs, or raise the ratio with `duplex config set full_ratio`; `duplex status` names the OSDs",
        ),
        Some(ClientError::Unavailable(_)) => {
            Some("is the cluster up? `duplex dev up` starts a local one; `duplex status` checks it")
        }
        Some(ClientError::TimedOut(..)) => Some("some PGs may have too few OSDs up: see `duplex status`"),
        _ => None,
    }
}

fn client_config(conf: Option<&Path>) -> Result<ClientConfig> {
    let path = match conf {
        Some(path) => path.to_path_buf(),
        None => {
            let default = Path::new(DEFAULT_DIR).join("client.toml");
            if !default.exists() {
                anyhow::bail!(
                    "no cluster configuration: pass --conf FILE, set DUPLEX_CONF, or start a local cluster with `duplex dev up`"
                );
            }
            default
        }
    };
    ClientConfig::from_file(&path).map_err(anyhow::Error::from)
}

fn connect(conf: Option<&Path>) -> Result<Client> {
    Ok(Client::connect(client_config(conf)?)?)
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Top::Dev(DevCommand::Up { dir, args }) => {
            dev::up(&dir, &args)?;
            print_next_steps(&dir, &args.pool);
        }
        Top::Dev(DevCommand::Down { dir, wipe }) => dev::down(&dir, wipe)?,
        Top::Dev(DevCommand::Restart { dir, osd_settings, only }) => dev::restart(&dir, &osd_settings, &only)?,
        Top::Dev(DevCommand::AddOsd { dir }) => {
            dev::add_osd(&dir)?;
        }
        Top::Dev(DevCommand::Demo { dir, seconds, image_size, up }) => demo(&dir, seconds, image_size, &up)?,
        Top::Pool(command) => admin::pool(&connect(cli.conf.as_deref())?, command)?,
        Top::Dedup(command) => dedup::dedup(&connect(cli.conf.as_deref())?, command)?,
        Top::Image(command) => admin::image(&connect(cli.conf.as_deref())?, &cli.pool, command)?,
        Top::Snap(command) => snap::snap(&connect(cli.conf.as_deref())?, &cli.pool, command)?,
        Top::Nbd(NbdCommand::Serve(args)) => {
            nbd::block_stop_signals();
            let client = connect(cli.conf.as_deref())?;
            let pool = client.pool_id(&cli.pool)?;
            let image = std::sync::Arc::new(client.open_spec(pool, &args.image)?);
            nbd::close_on_stop_signal(image.clone())?;
            let server = nbd::server(image, &args)?;
            server.run().context("the NBD server stopped")?;
        }
        Top::Pg(command) => admin::pg(&connect(cli.conf.as_deref())?, &cli.pool, command)?,
        Top::Mark(command) => admin::mark(&connect(cli.conf.as_deref())?, command)?,
        Top::Config(command) => admin::config(&connect(cli.conf.as_deref())?, command)?,
        Top::Status { json } => admin::status(&connect(cli.conf.as_deref())?, json)?,
        Top::Df { json } => df::df(&connect(cli.conf.as_deref())?, json)?,
        Top::Daemon { socket, command } => asok::run(&socket, command)?,
        Top::Bench(args) => {
            let client = connect(cli.conf.as_deref())?;
            let result = bench::run(&client, &cli.pool, &args)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                println!("{}", result.target);
                bench::print_table(&[result]);
            }
        }
        Top::Mon { config, args } => {
            let args: duplex_mon::cli::MonArgs = daemons::parse_with_config("duplex mon", config.as_ref(), &args)?;
            duplex_mon::cli::run(args)?;
        }
        Top::Osd { config, args } => {
            let args: duplex_osd::cli::OsdArgs = daemons::parse_with_config("duplex osd", config.as_ref(), &args)?;
            duplex_osd::cli::run(args)?;
        }
    }
    Ok(())
}

fn print_next_steps(dir: &Path, pool: &str) {
    let conf = dir.join("client.toml");
    println!();
    println!("next steps:");
    println!("  export DUPLEX_CONF={}", conf.display());
    println!("  duplex status");
    println!("  duplex image create disk --size 10G            # pool '{pool}'");
    println!("  duplex nbd serve --image disk --listen 127.0.0.1:10809");
    println!("  qemu-img info nbd://127.0.0.1:10809/disk       # or nbd-client, fio --ioengine=nbd");
    println!("  duplex dev down --dir {} --wipe              # stop and delete it all", dir.display());
}

/// The README's main job.
fn demo(dir: &Path, seconds: u64, image_size: u64, up: &dev::UpArgs) -> Result<()> {
    if dev::running(dir)?.is_none() {
        println!("starting a local cluster in {} …", dir.display());
        dev::up(dir, up)?;
    } else {
        println!("using the cluster already running in {}", dir.display());
    }
    let client = Client::connect(ClientConfig::from_file(&dir.join("client.toml"))?)?;
    let pool = client.pool_id(&up.pool)?;
    match client.create_image(pool, "demo", image_size, CreateOptions::default()) {
        Ok(info) => println!("created image 'demo' ({})", duplex_store::units::format_size(info.size)),
        Err(ClientError::ImageExists(_)) => println!("using the existing image 'demo'"),
        Err(err) => return Err(err.into()),
    }
    let mut results = Vec::new();
    for (pattern, queue_depth) in
        [(bench::Pattern::Randwrite, 1), (bench::Pattern::Randwrite, 32), (bench::Pattern::Randread, 32)]
    {
        let args = bench::BenchArgs {
            image: Some("demo".into()),
            pattern,
            block_size: 4096,
            queue_depth,
            seconds,
            read_percent: 70,
            objects: 0,
            json: false,
            rate: 0,
            intervals: false,
        };
        results.push(bench::run(&client, &up.pool, &args)?);
    }
    println!("\nimage {}/demo, 4 KiB I/O, {seconds} s per row:", up.pool);
    bench::print_table(&results);
    println!("\nthe cluster is still running (logs in {}).", dir.display());
    print_next_steps(dir, &up.pool);
    Ok(())
}
