use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = moderato::cli::Cli::parse();
    match moderato::cli::execute(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("moderato: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
