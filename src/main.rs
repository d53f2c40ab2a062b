use clap::Parser;

fn main() {
    let cli = gpubake::cli::Cli::parse();
    // Temporary files and directories go with an interrupted command (SIGINT, SIGTERM).
    gpubake::interrupt::install();
    let code = match gpubake::cli::run(cli) {
        Ok(code) => code,
        Err(err) => gpubake::cli::report_error(&err),
    };
    std::process::exit(code);
}
