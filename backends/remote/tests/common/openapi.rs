//! Checks request bodies, paths and query strings against the Fly Machines OpenAPI 3
//! document, read from disk at run time so the contract tests follow the published spec
//! instead of a copy of it that could drift.
//!
//! The schema validator covers the JSON Schema subset that swagger-generated OpenAPI 3.0
//! documents use, and is stricter than JSON Schema in one way: an object schema that
//! declares `properties` but says nothing about `additionalProperties` rejects keys it
//! does not declare, because our client must not invent fields the API does not know.
//! [`OpenApi::unsupported_keywords`] lists any schema keyword it would silently skip, so
//! a newer spec that starts using one is noticed rather than half-checked.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The spec's location below the directory that holds the workspace.
const SPEC_RELATIVE: &str = "specs/fly/machines-openapi3.2026-05-07.json";

/// Where schema names live, as a `$ref` prefix.
const SCHEMAS_REF: &str = "#/components/schemas/";

/// How many `$ref`s in a row [`Validator::deref`] follows before giving up on a chain
/// that only points at further references.
const MAX_REF_HOPS: usize = 64;

/// Schema keywords the validator enforces.
const ENFORCED_KEYWORDS: &[&str] = &[
    "$ref",
    "type",
    "nullable",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
];

/// Keywords skipped on purpose: annotations that do not constrain what a client may send,
/// plus `format`, whose values in swagger output (`int64`, `date-time`, ...) only refine a
/// `type` the validator already checks. Keywords starting with `x-` are skipped too.
/// Anything else (`pattern`, `readOnly`, `discriminator`, ...) is reported by
/// [`OpenApi::unsupported_keywords`] instead, because ignoring it could pass a bad body.
const IGNORED_KEYWORDS: &[&str] = &[
    "description",
    "title",
    "example",
    "examples",
    "default",
    "deprecated",
    "externalDocs",
    "xml",
    "format",
];

/// The path of the Fly Machines spec: `SANDCELL_FLY_SPEC` if set, else
/// `<workspace>/../shared/specs/fly/machines-openapi3.2026-05-07.json`, where
/// `<workspace>` is the nearest ancestor of this crate's manifest directory that holds
/// a `Cargo.lock`.
pub(crate) fn fly_spec_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDCELL_FLY_SPEC").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    shared_path(SPEC_RELATIVE)
}

/// The path of `relative` in the `shared/` directory beside the workspace.
pub(crate) fn shared_path(relative: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(manifest);
    // The parent keeps the path free of `..` so messages show where the file really is.
    let outside = workspace
        .parent()
        .map_or_else(|| workspace.join(".."), Path::to_path_buf);
    outside.join("shared").join(relative)
}

/// Reads a file of the specs in `shared/`: `None` (after saying why) when it is absent,
/// failing instead under `SANDCELL_REQUIRE_SPEC=1`.
pub(crate) fn read_shared(relative: &str) -> Option<String> {
    let path = shared_path(relative);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) => {
            let absent = format!("{}: {e}", path.display());
            sandcell::testing::require_or_skip("SPEC", relative, Err(absent));
            None
        }
    }
}

/// Loads E2B's control-plane spec (`shared/specs/e2b/openapi.yml`).
pub(crate) fn load_e2b_spec() -> Option<OpenApi> {
    let text = read_shared("specs/e2b/openapi.yml")?;
    let doc: Value = serde_yaml::from_str(&text).expect("E2B's openapi.yml is YAML");
    Some(OpenApi::from_value(doc))
}

/// Loads the spec from [`fly_spec_path`].
///
/// An absent file skips: it prints why to stderr and returns `None`, unless
/// `SANDCELL_REQUIRE_SPEC=1` (for CI), where it panics. A file that exists but cannot be
/// read, does not parse, or is not an OpenAPI 3 document panics, since that is a broken
/// checkout rather than a missing optional input.
pub(crate) fn load_fly_spec() -> Option<OpenApi> {
    let path = fly_spec_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let absent = format!(
                "{} is absent; set SANDCELL_FLY_SPEC to its path",
                path.display()
            );
            sandcell::testing::require_or_skip("SPEC", "the Fly Machines spec", Err(absent));
            return None;
        }
        Err(e) => panic!("cannot read the Fly Machines spec {}: {e}", path.display()),
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(doc) => doc,
        Err(e) => panic!("the Fly Machines spec {} is not JSON: {e}", path.display()),
    };
    let version = doc.get("openapi").and_then(Value::as_str).unwrap_or("");
    if !version.starts_with("3.") {
        panic!(
            "the Fly Machines spec {} is not an OpenAPI 3 document (openapi: {version:?})",
            path.display()
        );
    }
    Some(OpenApi::from_value(doc))
}

/// A parsed OpenAPI 3 document.
#[derive(Clone)]
pub(crate) struct OpenApi {
    doc: Value,
    /// The path of `servers[0].url` without a trailing slash (`/v1`), empty if none.
    base_path: String,
}

impl fmt::Debug for OpenApi {
    // The document is hundreds of kilobytes; a failed assertion should not print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |pointer: &str| {
            self.doc
                .pointer(pointer)
                .and_then(Value::as_object)
                .map_or(0, Map::len)
        };
        f.debug_struct("OpenApi")
            .field("base_path", &self.base_path)
            .field("paths", &count("/paths"))
            .field("schemas", &count("/components/schemas"))
            .finish_non_exhaustive()
    }
}

impl OpenApi {
    /// Wraps a parsed document. Nothing is checked here: lookups on a malformed document
    /// find nothing and say so.
    pub(crate) fn from_value(doc: Value) -> Self {
        let base_path = doc
            .pointer("/servers/0/url")
            .and_then(Value::as_str)
            .map(url_path)
            .unwrap_or_default();
        Self { doc, base_path }
    }

    /// Validates `value` against `#/components/schemas/<name>`.
    ///
    /// `Err` holds every violation found, each as `"<JSON pointer into value>: <what is
    /// wrong>"` (the pointer of the whole value is the empty string). On top of the JSON
    /// Schema rules, an object schema with `properties` and no `additionalProperties`
    /// rejects undeclared keys (see the module documentation); keys declared by schemas
    /// joined to it through `allOf` count as declared.
    pub(crate) fn validate_schema(&self, name: &str, value: &Value) -> Result<(), Vec<String>> {
        let Some(schema) = self
            .doc
            .pointer("/components/schemas")
            .and_then(|schemas| schemas.get(name))
        else {
            return Err(vec![format!("no schema {SCHEMAS_REF}{name} in the spec")]);
        };
        let reference = format!("{SCHEMAS_REF}{}", escape_pointer_token(name));
        let scope = Scope {
            refs: vec![reference.as_str()],
            siblings: BTreeSet::new(),
        };
        let mut errors = Vec::new();
        Validator { doc: &self.doc }.validate(schema, value, "", &scope, &mut errors);
        into_result(errors)
    }

    /// Validates `value` against the `application/json` request body schema of operation
    /// `method` (e.g. `"post"`) on the spec's templated `path` (e.g.
    /// `"/apps/{app_name}/machines"`), with the same rules as
    /// [`validate_schema`](Self::validate_schema). `Err` if the operation or its JSON body
    /// schema does not exist.
    pub(crate) fn validate_request(
        &self,
        method: &str,
        path: &str,
        value: &Value,
    ) -> Result<(), Vec<String>> {
        let method = method.to_ascii_lowercase();
        let validator = Validator { doc: &self.doc };
        let Some(operation) = self.operation(&method, path) else {
            return Err(vec![format!(
                "no operation {} {path} in the spec",
                method.to_ascii_uppercase()
            )]);
        };
        let schema = operation
            .get("requestBody")
            .and_then(|body| validator.deref(body))
            .and_then(|body| body.get("content"))
            .and_then(Value::as_object)
            .and_then(|content| {
                content
                    .iter()
                    .find(|(media_type, _)| is_json_media_type(media_type))
            })
            .and_then(|(_, media)| media.get("schema"));
        let Some(schema) = schema else {
            return Err(vec![format!(
                "operation {} {path} declares no application/json request body schema",
                method.to_ascii_uppercase()
            )]);
        };
        let mut errors = Vec::new();
        validator.validate(schema, value, "", &Scope::default(), &mut errors);
        into_result(errors)
    }

    /// Matches a concrete request path (e.g. `"/v1/apps/myapp/machines/abc/stop"`, with or
    /// without the base path of `servers[0].url`, and with any query string ignored) to the
    /// templated path of an operation with `method`, e.g.
    /// `"/apps/{app_name}/machines/{machine_id}/stop"`. A `{name}` segment matches any
    /// non-empty segment; segments that mix literal text and a template are compared
    /// literally (the spec has none). When several paths match, the one with a literal
    /// segment at the first position where they differ wins, as routers do.
    pub(crate) fn match_path(&self, method: &str, concrete: &str) -> Option<String> {
        let method = method.to_ascii_lowercase();
        let concrete = concrete.split(['?', '#']).next().unwrap_or_default();
        let concrete = if concrete.starts_with('/') {
            concrete.to_owned()
        } else {
            format!("/{concrete}")
        };
        // Try the path without the base first: that is how the spec spells its paths.
        strip_base(&concrete, &self.base_path)
            .and_then(|path| self.best_template(&method, path))
            .or_else(|| self.best_template(&method, &concrete))
    }

    /// The names of the query parameters operation `method` on the templated `path`
    /// declares, including those declared for every operation on the path, in
    /// declaration order. `None` if the operation does not exist.
    pub(crate) fn query_parameters(&self, method: &str, path: &str) -> Option<Vec<String>> {
        let method = method.to_ascii_lowercase();
        let operation = self.operation(&method, path)?;
        let validator = Validator { doc: &self.doc };
        let path_level = self
            .doc
            .get("paths")
            .and_then(|paths| paths.get(path))
            .and_then(|item| item.get("parameters"));
        let mut names = Vec::new();
        for parameter in [path_level, operation.get("parameters")]
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|parameter| validator.deref(parameter))
        {
            let in_query = parameter.get("in").and_then(Value::as_str) == Some("query");
            match parameter.get("name").and_then(Value::as_str) {
                Some(name) if in_query && !names.iter().any(|n| n == name) => {
                    names.push(name.to_owned());
                }
                _ => {}
            }
        }
        Some(names)
    }

    /// Every schema keyword in `components.schemas` and in the operations' JSON request
    /// body schemas that the validator neither enforces nor deliberately ignores, as
    /// `"<location in the document>: <keyword>"`. Empty means validation checks every
    /// constraint the document states.
    pub(crate) fn unsupported_keywords(&self) -> Vec<String> {
        let mut found = BTreeSet::new();
        if let Some(schemas) = self
            .doc
            .pointer("/components/schemas")
            .and_then(Value::as_object)
        {
            for (name, schema) in schemas {
                let location = format!("{SCHEMAS_REF}{}", escape_pointer_token(name));
                collect_unsupported(schema, &location, &mut found);
            }
        }
        if let Some(paths) = self.doc.get("paths").and_then(Value::as_object) {
            for (path, item) in paths {
                let Some(operations) = item.as_object() else {
                    continue;
                };
                for (method, operation) in operations {
                    let Some(content) = operation
                        .pointer("/requestBody/content")
                        .and_then(Value::as_object)
                    else {
                        continue;
                    };
                    for (media_type, media) in content {
                        if let Some(schema) = media.get("schema") {
                            let location = format!(
                                "#/paths/{}/{method}/requestBody/content/{}/schema",
                                escape_pointer_token(path),
                                escape_pointer_token(media_type)
                            );
                            collect_unsupported(schema, &location, &mut found);
                        }
                    }
                }
            }
        }
        found.into_iter().collect()
    }

    /// The templated path of an operation with `method` that `concrete` matches,
    /// preferring literal segments.
    fn best_template(&self, method: &str, concrete: &str) -> Option<String> {
        let segments: Vec<&str> = concrete.split('/').collect();
        self.doc
            .get("paths")?
            .as_object()?
            .iter()
            .filter(|(_, item)| item.get(method).is_some_and(Value::is_object))
            .filter_map(|(template, _)| {
                template_shape(template, &segments).map(|shape| (shape, template))
            })
            // `false` (literal) sorts before `true` (template), and `min_by` keeps the
            // first of equals, so the choice is deterministic.
            .min_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, template)| template.clone())
    }

    /// The operation object for a lowercase `method` on a templated `path`.
    fn operation(&self, method: &str, path: &str) -> Option<&Value> {
        self.doc
            .get("paths")?
            .get(path)?
            .get(method)
            .filter(|operation| operation.is_object())
    }
}

/// What validation carries along while it stays on the same value.
#[derive(Clone, Default)]
struct Scope<'a> {
    /// The `$ref`s already followed without descending into the value. Following one of
    /// them again would loop forever, since recursion only ends by consuming the value.
    refs: Vec<&'a str>,
    /// Property names declared by schemas joined to the current one through `allOf` (how
    /// swagger renders Go struct embedding), which the default strictness must accept.
    siblings: BTreeSet<&'a str>,
}

/// Validates values against schemas of one document.
struct Validator<'a> {
    doc: &'a Value,
}

impl<'a> Validator<'a> {
    /// The target of a local `$ref` (`#/...`); JSON-pointer escapes (`~0`, `~1`) are
    /// undone by [`Value::pointer`].
    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        self.doc.pointer(reference.strip_prefix('#')?)
    }

    /// Follows `$ref`s until reaching an object that is not a reference.
    fn deref(&self, mut node: &'a Value) -> Option<&'a Value> {
        for _ in 0..MAX_REF_HOPS {
            match node.get("$ref") {
                Some(reference) => node = self.resolve(reference.as_str()?)?,
                None => return Some(node),
            }
        }
        None
    }

    fn validate(
        &self,
        schema: &'a Value,
        value: &Value,
        pointer: &str,
        scope: &Scope<'a>,
        errors: &mut Vec<String>,
    ) {
        let map = match schema {
            Value::Object(map) => map,
            Value::Bool(true) => return,
            Value::Bool(false) => {
                errors.push(format!("{pointer}: no value is allowed here"));
                return;
            }
            _ => {
                errors.push(format!(
                    "{pointer}: the spec's schema here is not an object"
                ));
                return;
            }
        };
        if value.is_null() && map.get("nullable") == Some(&Value::Bool(true)) {
            return;
        }
        if let Some(reference) = map.get("$ref") {
            self.follow(reference, value, pointer, scope, errors);
        }
        if !self.check_type(map, value, pointer, errors) {
            // The other keywords would only restate the type mismatch.
            return;
        }
        check_enum(map, value, pointer, errors);
        match value {
            Value::Number(_) => check_number(map, value, pointer, errors),
            Value::String(text) => check_string(map, text, pointer, errors),
            Value::Array(elements) => self.check_array(map, elements, pointer, errors),
            Value::Object(object) => self.check_object(schema, map, object, pointer, scope, errors),
            Value::Null | Value::Bool(_) => {}
        }
        self.check_combinators(schema, map, value, pointer, scope, errors);
    }

    /// Validates `value` against the target of `reference`. Sibling keywords of a `$ref`
    /// are applied as well by the caller (as JSON Schema 2019+ does), which for
    /// swagger output only ever adds annotations.
    fn follow(
        &self,
        reference: &'a Value,
        value: &Value,
        pointer: &str,
        scope: &Scope<'a>,
        errors: &mut Vec<String>,
    ) {
        let Some(reference) = reference.as_str() else {
            errors.push(format!(
                "{pointer}: the spec has a $ref that is not a string"
            ));
            return;
        };
        if scope.refs.contains(&reference) {
            errors.push(format!(
                "{pointer}: the spec's {reference} leads back to itself at the same value (a cycle)"
            ));
            return;
        }
        let Some(target) = self.resolve(reference) else {
            errors.push(format!(
                "{pointer}: the spec's $ref {reference} resolves to nothing"
            ));
            return;
        };
        let mut inner = scope.clone();
        inner.refs.push(reference);
        self.validate(target, value, pointer, &inner, errors);
    }

    /// Checks `type`; returns whether the value has the type (`nullable` was handled by
    /// the caller).
    fn check_type(
        &self,
        map: &Map<String, Value>,
        value: &Value,
        pointer: &str,
        errors: &mut Vec<String>,
    ) -> bool {
        let Some(declared) = map.get("type") else {
            return true;
        };
        // swagger renders a Go field whose type is a named enum as
        // `{"type": "object", "allOf": [{"$ref": <the enum>}]}` even when the enum is a
        // string or an integer; the `allOf` members' own `type` is the truth then.
        if self.all_of_declares_type(map) {
            return true;
        }
        let names: Vec<&str> = match declared {
            Value::String(name) => vec![name.as_str()],
            Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
            _ => {
                errors.push(format!("{pointer}: the spec's `type` here is malformed"));
                return false;
            }
        };
        if names.iter().any(|name| has_type(value, name)) {
            return true;
        }
        errors.push(format!(
            "{pointer}: expected {}, found {}",
            names.join(" or "),
            describe(value)
        ));
        false
    }

    fn all_of_declares_type(&self, map: &Map<String, Value>) -> bool {
        map.get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|member| self.deref(member))
            .any(|member| member.get("type").is_some())
    }

    fn check_array(
        &self,
        map: &'a Map<String, Value>,
        elements: &[Value],
        pointer: &str,
        errors: &mut Vec<String>,
    ) {
        let count = elements.len() as u64;
        if let Some(min) = map.get("minItems").and_then(Value::as_u64) {
            if count < min {
                errors.push(format!(
                    "{pointer}: {count} items, fewer than minItems {min}"
                ));
            }
        }
        if let Some(max) = map.get("maxItems").and_then(Value::as_u64) {
            if count > max {
                errors.push(format!(
                    "{pointer}: {count} items, more than maxItems {max}"
                ));
            }
        }
        if let Some(items) = map.get("items") {
            for (index, element) in elements.iter().enumerate() {
                let child = format!("{pointer}/{index}");
                self.validate(items, element, &child, &Scope::default(), errors);
            }
        }
    }

    fn check_object(
        &self,
        schema: &'a Value,
        map: &'a Map<String, Value>,
        object: &Map<String, Value>,
        pointer: &str,
        scope: &Scope<'a>,
        errors: &mut Vec<String>,
    ) {
        for name in map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(name) {
                errors.push(format!("{pointer}: missing required property {name:?}"));
            }
        }
        let properties = map.get("properties").and_then(Value::as_object);
        let additional = map.get("additionalProperties");
        // The contract-test strictness: declared properties and no word on others means
        // the others are not part of the API.
        let strict = properties.is_some() && additional.is_none();
        let declared = if strict {
            let mut declared = scope.siblings.clone();
            declared.extend(self.declared_keys(schema));
            // Keys of `oneOf`/`anyOf` alternatives are judged by the alternative.
            for member in ["oneOf", "anyOf"]
                .into_iter()
                .filter_map(|keyword| map.get(keyword))
                .filter_map(Value::as_array)
                .flatten()
            {
                declared.extend(self.declared_keys(member));
            }
            declared
        } else {
            BTreeSet::new()
        };
        for (key, child) in object {
            let child_pointer = format!("{pointer}/{}", escape_pointer_token(key));
            if let Some(property) = properties.and_then(|properties| properties.get(key)) {
                self.validate(property, child, &child_pointer, &Scope::default(), errors);
                continue;
            }
            match additional {
                Some(Value::Bool(true)) => {}
                Some(Value::Bool(false)) => errors.push(format!(
                    "{child_pointer}: property is not allowed (additionalProperties is false)"
                )),
                Some(extra) => {
                    self.validate(extra, child, &child_pointer, &Scope::default(), errors);
                }
                None if strict && !declared.contains(key.as_str()) => errors.push(format!(
                    "{child_pointer}: property is not declared by the schema"
                )),
                None => {}
            }
        }
    }

    fn check_combinators(
        &self,
        schema: &'a Value,
        map: &'a Map<String, Value>,
        value: &Value,
        pointer: &str,
        scope: &Scope<'a>,
        errors: &mut Vec<String>,
    ) {
        let has_members = ["allOf", "anyOf", "oneOf"]
            .iter()
            .any(|keyword| map.contains_key(*keyword));
        let member_scope = if has_members {
            let mut member_scope = scope.clone();
            member_scope.siblings.extend(self.declared_keys(schema));
            member_scope
        } else {
            scope.clone()
        };
        for member in map
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.validate(member, value, pointer, &member_scope, errors);
        }
        // `oneOf` is checked like `anyOf`: generators emit `oneOf` over alternatives that
        // overlap (free-form objects, `{}`), where "exactly one" would reject good bodies.
        for keyword in ["anyOf", "oneOf"] {
            let Some(alternatives) = map.get(keyword).and_then(Value::as_array) else {
                continue;
            };
            if alternatives.is_empty() {
                continue;
            }
            let mut reasons = Vec::new();
            let mut matched = false;
            for (index, alternative) in alternatives.iter().enumerate() {
                let mut alternative_errors = Vec::new();
                self.validate(
                    alternative,
                    value,
                    pointer,
                    &member_scope,
                    &mut alternative_errors,
                );
                if alternative_errors.is_empty() {
                    matched = true;
                    break;
                }
                // Violations at this very value lose their repeated pointer.
                let own_prefix = format!("{pointer}: ");
                let details: Vec<&str> = alternative_errors
                    .iter()
                    .map(|error| error.strip_prefix(&own_prefix).unwrap_or(error))
                    .collect();
                reasons.push(format!("alternative {index}: {}", details.join("; ")));
            }
            if !matched {
                errors.push(format!(
                    "{pointer}: matches none of the {keyword} alternatives ({})",
                    reasons.join(" | ")
                ));
            }
        }
        if let Some(forbidden) = map.get("not") {
            let mut not_errors = Vec::new();
            self.validate(forbidden, value, pointer, scope, &mut not_errors);
            if not_errors.is_empty() {
                errors.push(format!("{pointer}: matches the schema under `not`"));
            }
        }
    }

    /// The property names a schema declares itself or through `$ref` and `allOf`.
    fn declared_keys(&self, schema: &'a Value) -> BTreeSet<&'a str> {
        let mut keys = BTreeSet::new();
        self.collect_keys(schema, &mut Vec::new(), &mut keys);
        keys
    }

    fn collect_keys(
        &self,
        schema: &'a Value,
        seen: &mut Vec<&'a str>,
        keys: &mut BTreeSet<&'a str>,
    ) {
        let Some(map) = schema.as_object() else {
            return;
        };
        if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
            // `seen` stops reference cycles, which would otherwise recurse forever.
            if !seen.contains(&reference) {
                seen.push(reference);
                if let Some(target) = self.resolve(reference) {
                    self.collect_keys(target, seen, keys);
                }
            }
        }
        if let Some(properties) = map.get("properties").and_then(Value::as_object) {
            keys.extend(properties.keys().map(String::as_str));
        }
        for member in map
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.collect_keys(member, seen, keys);
        }
    }
}

fn check_enum(map: &Map<String, Value>, value: &Value, pointer: &str, errors: &mut Vec<String>) {
    let Some(options) = map.get("enum").and_then(Value::as_array) else {
        return;
    };
    if !options.iter().any(|option| json_equal(option, value)) {
        let options: Vec<String> = options.iter().map(Value::to_string).collect();
        errors.push(format!(
            "{pointer}: {value} is not one of [{}]",
            options.join(", ")
        ));
    }
}

fn check_number(map: &Map<String, Value>, value: &Value, pointer: &str, errors: &mut Vec<String>) {
    let Some(number) = value.as_f64() else {
        return;
    };
    let bound = |keyword: &str| map.get(keyword).and_then(Value::as_f64);
    // OpenAPI 3.0 spells exclusivity as a boolean beside the bound, 3.1 as the bound itself.
    let exclusive = |keyword: &str| map.get(keyword) == Some(&Value::Bool(true));
    if let Some(min) = bound("minimum") {
        if number < min || (exclusive("exclusiveMinimum") && number == min) {
            errors.push(format!("{pointer}: {value} is below the minimum {min}"));
        }
    }
    if let Some(max) = bound("maximum") {
        if number > max || (exclusive("exclusiveMaximum") && number == max) {
            errors.push(format!("{pointer}: {value} is above the maximum {max}"));
        }
    }
    if let Some(min) = bound("exclusiveMinimum") {
        if number <= min {
            errors.push(format!("{pointer}: {value} is not above {min}"));
        }
    }
    if let Some(max) = bound("exclusiveMaximum") {
        if number >= max {
            errors.push(format!("{pointer}: {value} is not below {max}"));
        }
    }
}

fn check_string(map: &Map<String, Value>, text: &str, pointer: &str, errors: &mut Vec<String>) {
    let length = text.chars().count() as u64;
    if let Some(min) = map.get("minLength").and_then(Value::as_u64) {
        if length < min {
            errors.push(format!(
                "{pointer}: {length} characters, fewer than minLength {min}"
            ));
        }
    }
    if let Some(max) = map.get("maxLength").and_then(Value::as_u64) {
        if length > max {
            errors.push(format!(
                "{pointer}: {length} characters, more than maxLength {max}"
            ));
        }
    }
}

/// Whether `value` is of the JSON Schema type `name`. An integer is any number without a
/// fractional part, so `1.0` counts, as JSON Schema says.
fn has_type(value: &Value, name: &str) -> bool {
    match (name, value) {
        ("object", Value::Object(_))
        | ("array", Value::Array(_))
        | ("string", Value::String(_))
        | ("boolean", Value::Bool(_))
        | ("number", Value::Number(_))
        | ("null", Value::Null) => true,
        ("integer", Value::Number(number)) => {
            number.is_i64()
                || number.is_u64()
                || number
                    .as_f64()
                    .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => false,
    }
}

/// Names the JSON type of `value` for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if !number.is_f64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Equality as JSON Schema's `enum` means it: numbers compare by value, so `1` equals
/// `1.0`, which `Value`'s `==` denies.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        _ => a == b,
    }
}

/// Escapes one JSON pointer reference token (RFC 6901).
fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The path of a server URL (`https://api.machines.dev/v1` gives `/v1`), without a
/// trailing slash.
fn url_path(url: &str) -> String {
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |slash| &rest[slash..]),
        None => url,
    };
    path.split(['?', '#'])
        .next()
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_owned()
}

/// `concrete` without the leading `base`, if it starts with it as whole segments.
fn strip_base<'c>(concrete: &'c str, base: &str) -> Option<&'c str> {
    if base.is_empty() {
        return None;
    }
    match concrete.strip_prefix(base)? {
        "" => Some("/"),
        rest if rest.starts_with('/') => Some(rest),
        _ => None,
    }
}

/// How `template` matches the split concrete path: per segment, whether it matched a
/// `{name}` template (`true`) or literally (`false`); `None` if it does not match.
fn template_shape(template: &str, segments: &[&str]) -> Option<Vec<bool>> {
    let parts: Vec<&str> = template.split('/').collect();
    if parts.len() != segments.len() {
        return None;
    }
    parts
        .iter()
        .zip(segments)
        .map(|(part, segment)| {
            let templated = part.len() > 2 && part.starts_with('{') && part.ends_with('}');
            if templated {
                (!segment.is_empty()).then_some(true)
            } else {
                (part == segment).then_some(false)
            }
        })
        .collect()
}

fn is_json_media_type(media_type: &str) -> bool {
    media_type
        .split(';')
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

fn into_result(errors: Vec<String>) -> Result<(), Vec<String>> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Adds to `found` every keyword of `schema` and the schemas inside it that is neither
/// enforced nor deliberately ignored.
fn collect_unsupported(schema: &Value, location: &str, found: &mut BTreeSet<String>) {
    let Some(map) = schema.as_object() else {
        return;
    };
    for (keyword, inner) in map {
        let here = format!("{location}/{}", escape_pointer_token(keyword));
        match keyword.as_str() {
            "properties" => {
                for (name, property) in inner.as_object().into_iter().flatten() {
                    let at = format!("{here}/{}", escape_pointer_token(name));
                    collect_unsupported(property, &at, found);
                }
            }
            "items" | "additionalProperties" | "not" => collect_unsupported(inner, &here, found),
            "allOf" | "anyOf" | "oneOf" => {
                for (index, member) in inner.as_array().into_iter().flatten().enumerate() {
                    collect_unsupported(member, &format!("{here}/{index}"), found);
                }
            }
            _ => {}
        }
        let known = ENFORCED_KEYWORDS.contains(&keyword.as_str())
            || IGNORED_KEYWORDS.contains(&keyword.as_str())
            || keyword.starts_with("x-");
        if !known {
            found.insert(format!("{location}: {keyword}"));
        }
    }
}
