"""prefixgate's gateway: everything between a client and the replicas, one concern a package.

    server/     the HTTP face: create_app and start-up (where the parts are composed),
                the HTTP server and its bounds, the gateway's own routes, the live
                linter's observer
    request/    one routed request: the front door, exchange, dispatch, decider,
                proxy, relay, the lifecycle its observers hear, the drain
    prompt/     render, tokenize, cut into KV blocks, hash; memos and bounds
    replicas/   which replicas there are at run time, and their KV events
    fleet/      several instances sharing routing state through Redis
    auth/       client keys, tenants, limits
    ops/        metrics, the ops view and dashboard
    lint/       the prompt linter (live, API and CLI)
    kv/         the offline KV-cache tools: planner, quality gate, launch profiles
    cli.py      ``prefixgate``'s subcommands (imported when they run); serve_cli.py
                ``prefixgate serve``; config.py the settings

The layering is held by import-linter (``pyproject.toml``): the request path
and the prompt layer never import the linter, the KV tools or the HTTP face;
the linter and the KV tools never import the request path.
"""
