//! `tubeway function list|status|remove`.

use tubeway::ops::FunctionStatus;

use crate::cli::FunctionCommand;
use crate::output::{table, Printer};

/// Runs one function management command.
pub async fn run(cmd: FunctionCommand) -> anyhow::Result<()> {
    match cmd {
        FunctionCommand::Status { name, client } => {
            let out = Printer::new(client.json);
            let f = client.connect().await?.function_status(&name).await?;
            if out.is_json() {
                out.json_line(&f)?;
            } else {
                out.line(function_table(std::slice::from_ref(&f)))?;
            }
            Ok(())
        }
        FunctionCommand::Remove { name, client } => {
            let out = Printer::new(client.json);
            client.connect().await?.remove_function(&name).await?;
            Ok(out.removed("function", &name)?)
        }
        FunctionCommand::List { client } => {
            let out = Printer::new(client.json);
            let functions = client.connect().await?.list_functions().await?;
            Ok(out.list("functions", &functions, function_table)?)
        }
    }
}

/// The functions as a table, as `tubeway stats` shows them too.
pub fn function_table(functions: &[FunctionStatus]) -> String {
    let rows: Vec<Vec<String>> = functions
        .iter()
        .map(|f| {
            vec![
                f.name.clone(),
                if f.local { "yes" } else { "no" }.to_owned(),
                f.workers.to_string(),
                f.calls.to_string(),
                f.errors.to_string(),
                f.waiting.to_string(),
            ]
        })
        .collect();
    table(
        &["NAME", "LOCAL", "WORKERS", "CALLS", "ERRORS", "WAITING"],
        &rows,
    )
}
