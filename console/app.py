"""The console's pages as a Starlette app: topics, one topic (partitions, WAL tail, subscriptions
and their lag charted over time), the topic browser, brokers, pipelines, one pipeline, the speed
layer, and the two actions.

Handlers are plain functions, run by Starlette in its thread pool: they read the etcd cache and,
for the one page that needs it, storage, a Delta log tail or metrics endpoints. A source that
cannot be read is named in the page's problems and the rest renders. Every response says its
server time in a `Server-Timing` header (the benchmark and the browser test read it).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from danube_core.errors import DanubeError
from danube_core.message_page import read_message_page
from danube_core.topics import TopicName

from console import actions, pages
from console.metrics_scrape import scrape
from console.services import ConsoleServices

HERE = Path(__file__).resolve().parent
PAGE_NAMES = ("topics", "brokers", "pipelines", "speedlayer")


def timed(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Adds `Server-Timing: app;dur=<ms>` to a handler's response."""

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        started = time.perf_counter()
        response = handler(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response

    return wrapper


def build_app(services: ConsoleServices) -> Starlette:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(pages.FILTERS)
    config = services.config

    def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
        problems = [p for p in (services.etcd.problem, *context.pop("problems", ())) if p]
        return templates.TemplateResponse(request, template, {
            "problems": problems, "pages": PAGE_NAMES, "actions_enabled": config.actions_enabled, **context,
        }, status_code=status)

    @timed
    def topics_page(request: Request) -> Response:
        cache = services.etcd.cache
        namespaces = services.topics.namespaces(cache) if cache is not None else []
        owners = services.topics.owners(cache) if cache is not None else {}
        listed = {ns: services.topics.topics(cache, ns, owners) for ns in namespaces} if cache is not None else {}
        return render(request, "topics.html", page="topics", namespaces=listed)

    @timed
    def topic_page(request: Request) -> Response:
        name = f"/{request.path_params['namespace']}/{request.path_params['topic']}"
        cache = services.etcd.cache
        if cache is None:
            return render(request, "topic.html", 503, page="topics", name=name, topic=None)
        topic = services.topics.topic(cache, name)
        if topic is None:
            return render(request, "topic.html", 404, page="topics", name=name, topic=None,
                          problems=[f"topic {name} does not exist (deleted, or not created yet)"])
        tails = pages.wal_tails(services, cache, topic)
        charts = {f"{s.topic}|{s.name}": services.lag_history.series(s.topic, s.name) for s in topic.subscriptions}
        newest = {p.topic: pages.newest_offset(p, tails[p.topic]) for p in topic.partitions}
        return render(request, "topic.html", page="topics", name=name, topic=topic, tails=tails, newest=newest,
                      charts_json=json.dumps(charts), problems=[t.problem for t in tails.values() if t.problem])

    @timed
    def messages_page(request: Request) -> Response:
        name = f"/{request.path_params['namespace']}/{request.path_params['topic']}"
        cache = services.etcd.cache
        topic = services.topics.topic(cache, name) if cache is not None else None
        if cache is None or topic is None:
            return render(request, "messages.html", 404 if cache is not None else 503, page="topics", name=name,
                          page_read=None, problems=[] if cache is None else [f"topic {name} does not exist"])
        partition = pages.chosen_partition(topic, request.query_params.get("partition"))
        wal_url = pages.owner_wal_url(services, cache, partition)
        offset = pages.page_start(request.query_params.get("offset"), partition, config.page_messages)
        wal_dir = pages.topic_wal_dir(wal_url, TopicName.parse(partition.topic))
        read = read_message_page(cache, services.store, services.storage_keys, partition.topic, offset,
                                 config.page_messages, wal_dir)
        rows = pages.decoded_rows(cache, partition.topic, read.messages)
        return render(request, "messages.html", page="topics", name=name, topic=topic, partition=partition,
                      page_read=read, rows=rows, size=config.page_messages,
                      problems=[read.stopped] if read.stopped else [])

    @timed
    def brokers_page(request: Request) -> Response:
        cache = services.etcd.cache
        rows = services.brokers.brokers(cache) if cache is not None else []
        scrapes = {b.broker_id: scrape(b.registration.prom_exporter, config.metrics_timeout_ms / 1000)
                   for b in rows if b.registration is not None and b.registration.prom_exporter}
        return render(request, "brokers.html", page="brokers", brokers=rows, scrapes=scrapes,
                      problems=[s.problem for s in scrapes.values() if s.problem])

    @timed
    def pipelines_page(request: Request) -> Response:
        cache = services.etcd.cache
        rows = [pages.pipeline_summary(services, cache, p) for p in services.pipelines]
        return render(request, "pipelines.html", page="pipelines", pipelines=rows,
                      problems=[p.problem for p in services.pipelines if p.problem])

    @timed
    def pipeline_page(request: Request) -> Response:
        found = services.pipeline(request.path_params["name"])
        if found is None or found.config is None:
            return render(request, "pipeline.html", 404, page="pipelines", detail=None,
                          problems=[found.problem if found is not None else
                                    f"no pipeline {request.path_params['name']!r} in the console's configuration"])
        detail = pages.pipeline_detail(services, services.etcd.cache, found)
        return render(request, "pipeline.html", page="pipelines", detail=detail, problems=detail.problems)

    @timed
    def speedlayer_page(request: Request) -> Response:
        cache = services.etcd.cache
        state = services.speedlayer.state(cache) if cache is not None else None
        gateways = [pages.gateway_figures(scrape(e, config.metrics_timeout_ms / 1000))
                    for e in config.speedlayer.metrics]
        problems = [g.problem for g in gateways if g.problem] + (state.problems if state is not None else [])
        return render(request, "speedlayer.html", page="speedlayer", state=state, gateways=gateways,
                      masters=config.speedlayer.masters, problems=problems)

    async def action(request: Request) -> Response:
        form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
        token = request.headers.get("x-console-token") or form.get("token")
        kind = request.path_params["action"]
        try:
            actions.check_allowed(config, token)
            if kind == "admit":
                result = await run_in_threadpool(actions.admit, config, form.get("tenant", ""),
                                                 form.get("dataset", ""), form.get("table_uri", ""),
                                                 int(form.get("replication") or 0))
            elif kind == "drain":
                result = await run_in_threadpool(actions.drain, config, form.get("tenant", ""), form.get("worker", ""))
            else:
                return render(request, "action.html", 404, page="speedlayer", result=None,
                              problems=[f"no action {kind!r}"])
        except actions.ActionRefused as exc:
            return render(request, "action.html", 403, page="speedlayer", result=None, problems=[str(exc)])
        except (DanubeError, ValueError) as exc:
            return render(request, "action.html", 502, page="speedlayer",
                          result=actions.ActionResult(kind, False, str(exc)))
        return render(request, "action.html", 200 if result.ok else 502, page="speedlayer", result=result)

    def health(request: Request) -> Response:
        problem = services.etcd.problem
        return JSONResponse({"etcd": problem or "ok"}, status_code=200 if problem is None else 503)

    routes = [
        Route("/", lambda request: RedirectResponse("/topics")),
        Route("/topics", topics_page),
        Route("/topics/{namespace}/{topic}", topic_page),
        Route("/topics/{namespace}/{topic}/messages", messages_page),
        Route("/brokers", brokers_page),
        Route("/pipelines", pipelines_page),
        Route("/pipelines/{name}", pipeline_page),
        Route("/speedlayer", speedlayer_page),
        Route("/actions/{action}", action, methods=["POST"]),
        Route("/healthz", health),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes)
