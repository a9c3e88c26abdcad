//! The depth and complexity limits of a query (SPEC 5.1), and their refusal in GitLab's words.
//!
//! async-graphql refuses a query over either limit with "Query is too complex." or "Query is
//! nested too deep.", naming no figure. GitLab (graphql-ruby's analyzers) says "Query has
//! complexity of N, which exceeds max complexity of M", and a client can only trim a query
//! it can measure. The schemas that run queries keep async-graphql's limits, so that a refusal
//! costs one validation; only a refused request is measured again, by a schema without
//! limits whose one extension stops each request after validation with its figures. (An
//! extension on the running schemas would send every field of every answer through it.)
//!
//! What a field costs is said where the field is (`#[graphql(complexity)]`): 1 by default,
//! a page its size times what each node asks (`types::page_cost`), a list without a page
//! size what its items ask once, as GitLab prices a plain list, plus the work behind it
//! when that is more than a field's (a resource group, a stored snapshot).

use std::sync::{Arc, Mutex};

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextValidation};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{
    Schema, SchemaBuilder, ServerError, ValidationMode, ValidationResult, Variables,
};

use super::mutations::Mutation;
use super::subscriptions::Subscription;
use super::types::Query;
use super::EnvlensSchema;

/// Deep enough for the dashboard queries (project > environments > edges > node >
/// lastDeployment > agent > project > fullPath is 8), shallow enough to stop abuse.
pub const MAX_DEPTH: usize = 12;
/// Each field costs 1, pages their size times their nodes, stored and live groups the work
/// behind them; the dashboard's largest query costs some 2,000 (a test keeps every one of its
/// queries, and GitLab's frontend's, below).
pub const MAX_COMPLEXITY: usize = 5000;

/// async-graphql's refusals at its limits.
const TOO_COMPLEX: &str = "Query is too complex.";
const TOO_DEEP: &str = "Query is nested too deep.";

/// The schema's builder with the limits.
pub fn limited(
    builder: SchemaBuilder<Query, Mutation, Subscription>,
) -> SchemaBuilder<Query, Mutation, Subscription> {
    builder
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
}

/// What a query costs, as the limits count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    pub complexity: usize,
    pub depth: usize,
}

impl Figures {
    /// GitLab's refusal of a query with these figures (complexity judged first, as
    /// async-graphql does); `None` within both limits.
    pub fn refusal(&self) -> Option<String> {
        if self.complexity > MAX_COMPLEXITY {
            Some(format!(
                "Query has complexity of {}, which exceeds max complexity of {MAX_COMPLEXITY}",
                self.complexity
            ))
        } else if self.depth > MAX_DEPTH {
            Some(format!(
                "Query has depth of {}, which exceeds max depth of {MAX_DEPTH}",
                self.depth
            ))
        } else {
            None
        }
    }
}

/// The schema that measures: no limits, fast validation (the figures are the same in both
/// modes), and [`Measure`], which stops every request once validated.
pub fn measuring() -> EnvlensSchema {
    Schema::build(Query, Mutation::default(), Subscription)
        .validation_mode(ValidationMode::Fast)
        .extension(Measure)
        .finish()
}

/// Where [`Measure`] leaves a request's figures.
#[derive(Clone, Default)]
struct Slot(Arc<Mutex<Option<Figures>>>);

struct Measure;

impl ExtensionFactory for Measure {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Measure)
    }
}

#[async_trait::async_trait]
impl Extension for Measure {
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let result = next.run(ctx).await?;
        if let Some(Slot(slot)) = ctx.data_opt::<Slot>() {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Figures {
                complexity: result.complexity,
                depth: result.depth,
            });
        }
        // Nothing runs: the figures were all that was asked.
        Err(Vec::new())
    }
}

/// The figures of `doc` run with `variables` (a page size may be one) as `operation`; the
/// errors of a document that cannot be measured (an unknown operation, a cycle of fragments).
pub async fn measure(
    schema: &EnvlensSchema,
    doc: ExecutableDocument,
    variables: Variables,
    operation: Option<String>,
) -> Result<Figures, Vec<ServerError>> {
    let slot = Slot::default();
    let mut request = async_graphql::Request::new("")
        .variables(variables)
        .data(slot.clone());
    request.operation_name = operation;
    request.set_parsed_query(doc);
    let response = schema.execute(request).await;
    let figures = *slot.0.lock().unwrap_or_else(|e| e.into_inner());
    figures.ok_or(response.errors)
}

/// What a request needs to be measured again, kept before it runs: its variables and operation
/// name (its document is kept by `documents`).
pub struct Retained {
    variables: Variables,
    operation: Option<String>,
}

impl Retained {
    pub fn of(request: &async_graphql::Request) -> Self {
        Retained {
            variables: request.variables.clone(),
            operation: request.operation_name.clone(),
        }
    }

    /// When `response` is async-graphql's refusal at a limit, words it as GitLab does, with
    /// the figures of `doc`.
    pub async fn explain(
        self,
        schema: &EnvlensSchema,
        doc: &ExecutableDocument,
        response: &mut async_graphql::Response,
    ) {
        let [error] = response.errors.as_mut_slice() else {
            return;
        };
        if error.message != TOO_COMPLEX && error.message != TOO_DEEP {
            return;
        }
        let measured = measure(schema, doc.clone(), self.variables, self.operation).await;
        if let Some(refusal) = measured.ok().and_then(|f| f.refusal()) {
            error.message = refusal;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    async fn figures(text: &str, variables: serde_json::Value) -> Figures {
        let doc = parse_query(text).unwrap();
        measure(&measuring(), doc, Variables::from_json(variables), None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn pages_count_their_size_and_plain_lists_their_items_once() {
        let env = |first: &str| {
            format!(
                r#"{{ project(fullPath: "a") {{ environments({first}) {{ nodes {{ id name }} }} }} }}"#
            )
        };
        // project 1 + a page of n nodes (1 + id + name = 3 each).
        for (args, cost) in [
            ("first: 10", 31),
            ("first: 100", 301),
            ("search: \"x\"", 61),
        ] {
            let f = figures(&env(args), serde_json::json!({})).await;
            assert_eq!(f.complexity, cost, "{args}");
            assert_eq!(f.depth, 4);
        }
        let with_variable = "query($n: Int) { project(fullPath: \"a\") { environments(first: $n) { nodes { id name } } } }";
        let f = figures(with_variable, serde_json::json!({"n": 7})).await;
        assert_eq!(f.complexity, 22);
    }

    #[test]
    fn refusals_name_the_figure_and_the_limit_as_gitlab_does() {
        let over = Figures {
            complexity: 5115,
            depth: 20,
        };
        assert_eq!(
            over.refusal().unwrap(),
            "Query has complexity of 5115, which exceeds max complexity of 5000"
        );
        let deep = Figures {
            complexity: 40,
            depth: 13,
        };
        assert_eq!(
            deep.refusal().unwrap(),
            "Query has depth of 13, which exceeds max depth of 12"
        );
        assert_eq!(
            Figures {
                complexity: MAX_COMPLEXITY,
                depth: MAX_DEPTH
            }
            .refusal(),
            None
        );
    }

    /// The queries GitLab's frontend sends (SPEC 5.1), as the tests load them.
    #[tokio::test]
    async fn gitlabs_frontend_queries_are_within_the_limits() {
        let folder = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/frontend_queries"
        );
        let mut measured = 0;
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "graphql") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let f = figures(&text, serde_json::json!({})).await;
            eprintln!("{}: {f:?}", path.display());
            assert_eq!(f.refusal(), None, "{}: {f:?}", path.display());
            measured += 1;
        }
        assert_eq!(measured, 5);
    }
}
