//! `via-run -n N prog args...`: runs a vmpi job of N processes on this host.
#![forbid(unsafe_code)]

use clap::Parser;

/// Starts N processes of a message-passing job on this host.
#[derive(Parser, Debug)]
#[command(name = "via-run", version, trailing_var_arg = true)]
struct Args {
    /// Number of processes.
    #[arg(short = 'n', long = "np", default_value_t = 1)]
    n: u32,
    /// Extra environment for every process (`NAME=VALUE`, repeatable).
    #[arg(short = 'x', long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The program and its arguments.
    #[arg(required = true, allow_hyphen_values = true)]
    argv: Vec<String>,
}

fn main() {
    env_logger::init();
    let a = Args::parse();
    let mut env = Vec::new();
    for e in &a.env {
        match e.split_once('=') {
            Some((k, v)) => env.push((k.to_string(), v.to_string())),
            None => {
                eprintln!("via-run: -x {e}: expected NAME=VALUE");
                std::process::exit(2);
            }
        }
    }
    let spec = vmpi::launch::Spec {
        n: a.n,
        argv: a.argv,
        env,
    };
    match vmpi::launch::run(&spec) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("via-run: {e}");
            std::process::exit(2);
        }
    }
}
