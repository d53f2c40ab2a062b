use clap::Parser;

fn main() {
    let cli = gpubake::cmd::Cli::parse();
    // Temporary files and directories go with an interrupted command (SIGINT, SIGTERM).
    gpubake::interrupt::install();
    // A reader that stops early (`gpubake compat | head -1`) closes the pipe, and printing
    // to it panics. That is no fault of gpubake's: say nothing, unwind (temporary files go
    // with their owners) and end as a command the closed pipe stopped, by SIGPIPE.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !stdout_reader_gone() {
            default_hook(info);
        }
    }));
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gpubake::cmd::run(cli)));
    let code = match run {
        Ok(Ok(code)) => code,
        Ok(Err(gpubake::Error::Io { source, .. }))
            if source.kind() == std::io::ErrorKind::BrokenPipe && stdout_reader_gone() =>
        {
            stopped_by_the_pipe()
        }
        Ok(Err(err)) => gpubake::cmd::report_error(&err),
        Err(_) if stdout_reader_gone() => stopped_by_the_pipe(),
        Err(panic) => std::panic::resume_unwind(panic),
    };
    std::process::exit(code);
}

/// Ends the process by SIGPIPE, as a command writing to a closed pipe ends by default.
fn stopped_by_the_pipe() -> i32 {
    // SAFETY: restoring the default action of a signal and raising it in this process; no
    // handler of ours runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Not reached: the default action of SIGPIPE ends the process. 141 is what a shell
    // reports for it.
    141
}

/// Whether standard output is a pipe whose reading end is closed: poll reports an error on
/// the writing end then.
fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready == 1 && fd.revents & libc::POLLERR != 0
}
