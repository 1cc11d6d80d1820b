--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: attempts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.attempts (
    id integer NOT NULL,
    job_id integer,
    key character varying(256) NOT NULL,
    attempt integer NOT NULL,
    server_id integer,
    placed_by character varying(64),
    dispatched double precision,
    started double precision,
    finished double precision,
    outcome character varying(16),
    items bigint NOT NULL,
    load_seconds double precision NOT NULL,
    cold boolean NOT NULL,
    loss_id integer
);


--
-- Name: attempts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.attempts_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: attempts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.attempts_id_seq OWNED BY public.attempts.id;


--
-- Name: catalog_meta; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.catalog_meta (
    key character varying(64) NOT NULL,
    value text NOT NULL
);


--
-- Name: contexts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.contexts (
    id integer NOT NULL,
    identity character varying(64) NOT NULL,
    name character varying(256) NOT NULL,
    loader text NOT NULL,
    arguments text NOT NULL,
    bytes bigint,
    first_seen double precision NOT NULL
);


--
-- Name: contexts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.contexts_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: contexts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.contexts_id_seq OWNED BY public.contexts.id;


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    id integer NOT NULL,
    at double precision NOT NULL,
    kind character varying(32) NOT NULL,
    run_pk integer,
    server_id integer,
    text text NOT NULL
);


--
-- Name: events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.events_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.events_id_seq OWNED BY public.events.id;


--
-- Name: jobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.jobs (
    id integer NOT NULL,
    run_pk integer NOT NULL,
    jobid character varying(64) NOT NULL,
    rule character varying(256) NOT NULL,
    wildcards text NOT NULL,
    kind character varying(16) NOT NULL,
    context_id integer,
    submitted double precision,
    finished double precision,
    outcome character varying(16),
    items bigint NOT NULL
);


--
-- Name: jobs_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.jobs_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: jobs_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.jobs_id_seq OWNED BY public.jobs.id;


--
-- Name: placements; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.placements (
    id integer NOT NULL,
    context_id integer NOT NULL,
    server_id integer NOT NULL,
    state character varying(16) NOT NULL,
    loading_at double precision NOT NULL,
    ready_at double precision,
    ended_at double precision,
    load_seconds double precision,
    from_cache boolean,
    bytes bigint
);


--
-- Name: placements_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.placements_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: placements_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.placements_id_seq OWNED BY public.placements.id;


--
-- Name: runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.runs (
    id integer NOT NULL,
    run_id character varying(128) NOT NULL,
    workdir text NOT NULL,
    host character varying(256) NOT NULL,
    pid integer NOT NULL,
    cluster text NOT NULL,
    jobs_total integer,
    started double precision NOT NULL,
    finished double precision,
    heartbeat double precision,
    ok boolean,
    jobs_ok integer NOT NULL,
    jobs_failed integer NOT NULL,
    items bigint NOT NULL,
    loads integer NOT NULL
);


--
-- Name: runs_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.runs_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: runs_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.runs_id_seq OWNED BY public.runs.id;


--
-- Name: server_losses; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.server_losses (
    id integer NOT NULL,
    server_id integer NOT NULL,
    at double precision NOT NULL,
    reason text NOT NULL,
    jobs_lost integer NOT NULL,
    seconds_lost double precision NOT NULL
);


--
-- Name: server_losses_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.server_losses_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: server_losses_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.server_losses_id_seq OWNED BY public.server_losses.id;


--
-- Name: servers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.servers (
    id integer NOT NULL,
    address character varying(256) NOT NULL,
    name character varying(256) NOT NULL,
    host character varying(256) NOT NULL,
    pid integer,
    gpu_index integer,
    gpu_uuid character varying(128),
    gpu_name character varying(256),
    gpu_model character varying(256) NOT NULL,
    gpu_memory_bytes bigint,
    compute_capability character varying(16),
    is_mig boolean NOT NULL,
    slots integer NOT NULL,
    memory_bytes bigint,
    memory_budget bigint,
    joined double precision NOT NULL,
    "left" double precision,
    left_reason text
);


--
-- Name: servers_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.servers_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: servers_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.servers_id_seq OWNED BY public.servers.id;


--
-- Name: attempts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.attempts ALTER COLUMN id SET DEFAULT nextval('public.attempts_id_seq'::regclass);


--
-- Name: contexts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.contexts ALTER COLUMN id SET DEFAULT nextval('public.contexts_id_seq'::regclass);


--
-- Name: events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events ALTER COLUMN id SET DEFAULT nextval('public.events_id_seq'::regclass);


--
-- Name: jobs id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.jobs ALTER COLUMN id SET DEFAULT nextval('public.jobs_id_seq'::regclass);


--
-- Name: placements id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.placements ALTER COLUMN id SET DEFAULT nextval('public.placements_id_seq'::regclass);


--
-- Name: runs id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs ALTER COLUMN id SET DEFAULT nextval('public.runs_id_seq'::regclass);


--
-- Name: server_losses id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.server_losses ALTER COLUMN id SET DEFAULT nextval('public.server_losses_id_seq'::regclass);


--
-- Name: servers id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.servers ALTER COLUMN id SET DEFAULT nextval('public.servers_id_seq'::regclass);


--
-- Data for Name: attempts; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.attempts VALUES (21, 19, 'work-5-a1-7561ece1.1', 1, 4, 'warm', 1796108174.3999348, 1796108174.4228666, 1796108174.79731, 'lost', 0, 0, false, 2);
INSERT INTO public.attempts VALUES (1, 1, 'work-6-a1-a3df9152.1', 1, 2, 'any', 1796108156.3145392, 1796108156.349865, 1796108157.8843713, 'ok', 0, 0.00035116300000481715, true, NULL);
INSERT INTO public.attempts VALUES (2, 2, 'work-7-a1-78d0db3c.1', 1, 1, 'load', 1796108156.3834267, 1796108157.3373432, 1796108158.8851707, 'ok', 0, 0.0003756390001399268, true, NULL);
INSERT INTO public.attempts VALUES (20, 18, 'work-23-a1-aa3fea26.1', 1, 1, 'warm', 1796108174.3517683, 1796108174.3785577, 1796108175.891899, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (3, 3, 'work-14-a1-82b832ee.1', 1, 2, 'warm', 1796108157.9363127, 1796108157.9546604, 1796108159.4608731, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (4, 4, 'work-22-a1-40f34a7a.1', 1, 1, 'warm', 1796108158.9171708, 1796108158.9231818, 1796108160.4296813, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (5, 5, 'work-15-a1-8d867b63.1', 1, 2, 'warm', 1796108159.4966595, 1796108159.5041819, 1796108161.0139878, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (22, 19, 'work-5-a1-7561ece1.2', 1, 1, 'queued', 1796108174.7981846, 1796108175.9061232, 1796108177.4191234, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (6, 6, 'work-12-a1-5f1406c2.1', 1, 1, 'warm', 1796108160.4565873, 1796108160.4624188, 1796108161.971687, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (7, 7, 'work-1-a1-458cf2ba.1', 1, 2, 'warm', 1796108161.0482714, 1796108161.0557563, 1796108162.5617425, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (8, 8, 'work-17-a1-8f2f8437.1', 1, 1, 'warm', 1796108162.0133548, 1796108162.0205758, 1796108163.5264904, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (9, 9, 'work-8-a1-4b9bc101.1', 1, 2, 'warm', 1796108162.5925055, 1796108162.6034105, 1796108164.1078231, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (11, 11, 'work-20-a1-e15d2f5a.1', 1, 2, 'warm', 1796108164.148113, 1796108164.153026, 1796108164.7956333, 'lost', 0, 0, false, 1);
INSERT INTO public.attempts VALUES (10, 10, 'work-18-a1-ba8b1b62.1', 1, 1, 'warm', 1796108163.5742142, 1796108163.5796037, 1796108165.085659, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (23, 20, 'work-21-a1-32357495.1', 1, 1, 'queued', 1796108175.9489567, 1796108177.4398031, 1796108178.9612603, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (12, 11, 'work-20-a1-e15d2f5a.2', 1, 1, 'queued', 1796108164.7969387, 1796108165.087623, 1796108166.5910683, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (13, 12, 'work-9-a1-fcbee3f9.1', 1, 1, 'queued', 1796108165.117219, 1796108166.6026852, 1796108168.1249127, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (15, 14, 'work-13-a1-555e2334.1', 1, 3, 'load', 1796108168.213551, 1796108168.2337263, NULL, NULL, 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (14, 13, 'work-4-a1-9c143c0b.1', 1, 1, 'queued', 1796108166.6574817, 1796108168.1335275, 1796108169.6516306, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (24, 21, 'work-3-a1-d2f97f13.1', 1, 5, 'load', 1796108177.477964, 1796108177.4987755, 1796108179.0751987, 'ok', 0, 0.0004822079999939888, true, NULL);
INSERT INTO public.attempts VALUES (16, 15, 'work-11-a1-914cfc98.1', 1, 1, 'warm', 1796108169.7002792, 1796108169.7241685, 1796108171.2358258, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (17, 14, 'work-13-a1-555e2334.2', 1, 1, 'queued', 1796108169.842449, 1796108171.2596228, 1796108172.7628636, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (25, 22, 'work-19-a1-35f8a719.1', 1, 1, 'warm', 1796108178.988834, 1796108179.007177, 1796108180.512658, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (18, 16, 'work-2-a1-3b4a0d36.1', 1, 1, 'queued', 1796108171.2832928, 1796108172.767426, 1796108174.2817736, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (19, 17, 'work-16-a1-b633ef3e.1', 1, 4, 'load', 1796108172.7912421, 1796108172.801664, 1796108174.3481224, 'ok', 0, 0.0004279770000721328, true, NULL);
INSERT INTO public.attempts VALUES (26, 23, 'work-24-a1-9e93c901.1', 1, 5, 'warm', 1796108179.104021, 1796108179.1107893, 1796108180.621938, 'ok', 0, 0, false, NULL);
INSERT INTO public.attempts VALUES (27, 24, 'work-10-a1-8be5dc2a.1', 1, 1, 'warm', 1796108180.5510294, 1796108180.5602577, 1796108182.0678315, 'ok', 0, 0, false, NULL);


--
-- Data for Name: catalog_meta; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.catalog_meta VALUES ('schema_version', '1');
INSERT INTO public.catalog_meta VALUES ('created', '1796108156.1671329');


--
-- Data for Name: contexts; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.contexts VALUES (1, 'fd70540f062ca9dab1d841fb4508971948a939ea3078140fbb30bb72e0f47af5', 'toy', 'loaders.py:load_toy', '{}', NULL, 1796108156.3145392);


--
-- Data for Name: events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.events VALUES (1, 1796108156.2010627, 'run-started', 1, NULL, 'run 20261201T065552-15657 started in /tmp/oldcat/wf, 24 job(s) planned');
INSERT INTO public.events VALUES (2, 1796108156.2011127, 'server-joined', NULL, 1, 'cpu1 joined (tls://127.0.0.1:35815)');
INSERT INTO public.events VALUES (3, 1796108156.2011263, 'server-joined', NULL, 2, 'cpu0 joined (tls://127.0.0.1:44095)');
INSERT INTO public.events VALUES (4, 1796108156.3736494, 'context-ready', NULL, 2, 'toy loaded on cpu0 in 0.0 s');
INSERT INTO public.events VALUES (5, 1796108157.3689382, 'context-ready', NULL, 1, 'toy loaded on cpu1 in 0.0 s');
INSERT INTO public.events VALUES (6, 1796108164.7825632, 'kill-injected', NULL, 2, 'cpu0: injected signal 9 (pid 15686)');
INSERT INTO public.events VALUES (7, 1796108164.7956333, 'server-lost', NULL, 2, 'cpu0 lost with 1 job(s) running, 0.6 s of work (preemption: injected SIGKILL (handle-worker-cleanup))');
INSERT INTO public.events VALUES (8, 1796108167.2924914, 'server-joined', NULL, 3, 'cpu0 joined (tls://127.0.0.1:37831)');
INSERT INTO public.events VALUES (9, 1796108168.2704751, 'context-ready', NULL, 3, 'toy loaded on cpu0 in 0.0 s');
INSERT INTO public.events VALUES (10, 1796108169.812418, 'kill-injected', NULL, 3, 'cpu0: injected signal 9 (pid 15942)');
INSERT INTO public.events VALUES (11, 1796108169.8394477, 'server-left', NULL, 3, 'cpu0 left (preemption: injected SIGKILL (handle-worker-cleanup))');
INSERT INTO public.events VALUES (12, 1796108171.9556477, 'server-joined', NULL, 4, 'cpu0 joined (tls://127.0.0.1:46663)');
INSERT INTO public.events VALUES (13, 1796108172.8308012, 'context-ready', NULL, 4, 'toy loaded on cpu0 in 0.0 s');
INSERT INTO public.events VALUES (14, 1796108174.7764904, 'kill-injected', NULL, 4, 'cpu0: injected signal 9 (pid 16120)');
INSERT INTO public.events VALUES (15, 1796108174.79731, 'server-lost', NULL, 4, 'cpu0 lost with 1 job(s) running, 0.4 s of work (preemption: injected SIGKILL (handle-worker-cleanup))');
INSERT INTO public.events VALUES (16, 1796108176.8147092, 'server-joined', NULL, 5, 'cpu0 joined (tls://127.0.0.1:38667)');
INSERT INTO public.events VALUES (17, 1796108177.5652597, 'context-ready', NULL, 5, 'toy loaded on cpu0 in 0.0 s');
INSERT INTO public.events VALUES (18, 1796108182.1269822, 'run-finished', 1, NULL, 'run 20261201T065552-15657 ended');


--
-- Data for Name: jobs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.jobs VALUES (1, 1, '6', 'work', '{"i": "5"}', 'context', 1, 1796108156.3124704, 1796108157.9061794, 'ok', 0);
INSERT INTO public.jobs VALUES (2, 1, '7', 'work', '{"i": "6"}', 'context', 1, 1796108156.3156025, 1796108158.9016664, 'ok', 0);
INSERT INTO public.jobs VALUES (3, 1, '14', 'work', '{"i": "13"}', 'context', 1, 1796108157.935361, 1796108159.47938, 'ok', 0);
INSERT INTO public.jobs VALUES (4, 1, '22', 'work', '{"i": "21"}', 'context', 1, 1796108158.9163013, 1796108160.4423208, 'ok', 0);
INSERT INTO public.jobs VALUES (5, 1, '15', 'work', '{"i": "14"}', 'context', 1, 1796108159.4956806, 1796108161.0333025, 'ok', 0);
INSERT INTO public.jobs VALUES (6, 1, '12', 'work', '{"i": "11"}', 'context', 1, 1796108160.4556859, 1796108161.9835775, 'ok', 0);
INSERT INTO public.jobs VALUES (7, 1, '1', 'work', '{"i": "0"}', 'context', 1, 1796108161.0470307, 1796108162.573889, 'ok', 0);
INSERT INTO public.jobs VALUES (8, 1, '17', 'work', '{"i": "16"}', 'context', 1, 1796108162.010132, 1796108163.5536187, 'ok', 0);
INSERT INTO public.jobs VALUES (9, 1, '8', 'work', '{"i": "7"}', 'context', 1, 1796108162.5910563, 1796108164.1324186, 'ok', 0);
INSERT INTO public.jobs VALUES (10, 1, '18', 'work', '{"i": "17"}', 'context', 1, 1796108163.5728695, 1796108165.0987308, 'ok', 0);
INSERT INTO public.jobs VALUES (11, 1, '20', 'work', '{"i": "19"}', 'context', 1, 1796108164.1472402, 1796108166.6380775, 'ok', 0);
INSERT INTO public.jobs VALUES (12, 1, '9', 'work', '{"i": "8"}', 'context', 1, 1796108165.1163473, 1796108168.1765552, 'ok', 0);
INSERT INTO public.jobs VALUES (13, 1, '4', 'work', '{"i": "3"}', 'context', 1, 1796108166.6562645, 1796108169.6730664, 'ok', 0);
INSERT INTO public.jobs VALUES (15, 1, '11', 'work', '{"i": "10"}', 'context', 1, 1796108169.6991682, 1796108171.27274, 'ok', 0);
INSERT INTO public.jobs VALUES (14, 1, '13', 'work', '{"i": "12"}', 'context', 1, 1796108168.2120726, 1796108172.7797313, 'ok', 0);
INSERT INTO public.jobs VALUES (16, 1, '2', 'work', '{"i": "1"}', 'context', 1, 1796108171.2824311, 1796108174.3074265, 'ok', 0);
INSERT INTO public.jobs VALUES (17, 1, '16', 'work', '{"i": "15"}', 'context', 1, 1796108172.7903693, 1796108174.3681002, 'ok', 0);
INSERT INTO public.jobs VALUES (18, 1, '23', 'work', '{"i": "22"}', 'context', 1, 1796108174.3457205, 1796108175.915117, 'ok', 0);
INSERT INTO public.jobs VALUES (19, 1, '5', 'work', '{"i": "4"}', 'context', 1, 1796108174.3853984, 1796108177.4586093, 'ok', 0);
INSERT INTO public.jobs VALUES (20, 1, '21', 'work', '{"i": "20"}', 'context', 1, 1796108175.9415607, 1796108178.9742672, 'ok', 0);
INSERT INTO public.jobs VALUES (21, 1, '3', 'work', '{"i": "2"}', 'context', 1, 1796108177.477064, 1796108179.0921543, 'ok', 0);
INSERT INTO public.jobs VALUES (22, 1, '19', 'work', '{"i": "18"}', 'context', 1, 1796108178.988001, 1796108180.5349479, 'ok', 0);
INSERT INTO public.jobs VALUES (23, 1, '24', 'work', '{"i": "23"}', 'context', 1, 1796108179.1031868, 1796108180.6373055, 'ok', 0);
INSERT INTO public.jobs VALUES (24, 1, '10', 'work', '{"i": "9"}', 'context', 1, 1796108180.550135, 1796108182.0870168, 'ok', 0);


--
-- Data for Name: placements; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.placements VALUES (2, 1, 1, 'ready', 1796108157.3663726, 1796108157.3689382, NULL, 0.0003756390001399268, NULL, NULL);
INSERT INTO public.placements VALUES (1, 1, 2, 'lost', 1796108156.3725748, 1796108156.3736494, 1796108164.7956333, 0.00035116300000481715, NULL, NULL);
INSERT INTO public.placements VALUES (3, 1, 3, 'lost', 1796108168.2671437, 1796108168.2704751, 1796108169.8394477, 0.0021315219998996326, NULL, NULL);
INSERT INTO public.placements VALUES (4, 1, 4, 'lost', 1796108172.823715, 1796108172.8308012, 1796108174.79731, 0.0004279770000721328, NULL, NULL);
INSERT INTO public.placements VALUES (5, 1, 5, 'ready', 1796108177.5565429, 1796108177.5652597, NULL, 0.0004822079999939888, NULL, NULL);


--
-- Data for Name: runs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.runs VALUES (1, '20261201T065552-15657', '/tmp/oldcat/wf', 'vm', 15657, 'embedded cluster (/tmp/oldcat/wf/.snakemake/context/cluster/20261201T065552-15657.log)', 24, 1796108156.2010627, 1796108182.1269822, 1796108182.1269822, true, 24, 0, 0, 4);


--
-- Data for Name: server_losses; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.server_losses VALUES (1, 2, 1796108164.7956333, 'preemption: injected SIGKILL (handle-worker-cleanup)', 1, 0.6426072120666504);
INSERT INTO public.server_losses VALUES (2, 4, 1796108174.79731, 'preemption: injected SIGKILL (handle-worker-cleanup)', 1, 0.37444353103637695);


--
-- Data for Name: servers; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.servers VALUES (1, 'tls://127.0.0.1:35815', 'cpu1', '', NULL, NULL, NULL, NULL, 'cpu', NULL, NULL, false, 1, NULL, 10110423859, 1796108156.2011127, NULL, NULL);
INSERT INTO public.servers VALUES (2, 'tls://127.0.0.1:44095', 'cpu0', '', NULL, NULL, NULL, NULL, 'cpu', NULL, NULL, false, 1, NULL, 10110423859, 1796108156.2011263, 1796108164.7956333, 'preemption: injected SIGKILL (handle-worker-cleanup)');
INSERT INTO public.servers VALUES (3, 'tls://127.0.0.1:37831', 'cpu0', 'vm', 15942, NULL, NULL, NULL, 'cpu', NULL, NULL, false, 1, 12638029824, 10110423859, 1796108167.2924914, 1796108169.8394477, 'preemption: injected SIGKILL (handle-worker-cleanup)');
INSERT INTO public.servers VALUES (4, 'tls://127.0.0.1:46663', 'cpu0', 'vm', 16120, NULL, NULL, NULL, 'cpu', NULL, NULL, false, 1, 12638029824, 10110423859, 1796108171.9556477, 1796108174.79731, 'preemption: injected SIGKILL (handle-worker-cleanup)');
INSERT INTO public.servers VALUES (5, 'tls://127.0.0.1:38667', 'cpu0', 'vm', 16340, NULL, NULL, NULL, 'cpu', NULL, NULL, false, 1, 12638029824, 10110423859, 1796108176.8147092, NULL, NULL);


--
-- Name: attempts_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.attempts_id_seq', 27, true);


--
-- Name: contexts_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.contexts_id_seq', 1, true);


--
-- Name: events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.events_id_seq', 18, true);


--
-- Name: jobs_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.jobs_id_seq', 24, true);


--
-- Name: placements_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.placements_id_seq', 5, true);


--
-- Name: runs_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.runs_id_seq', 1, true);


--
-- Name: server_losses_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.server_losses_id_seq', 2, true);


--
-- Name: servers_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.servers_id_seq', 5, true);


--
-- Name: attempts attempts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);


--
-- Name: catalog_meta catalog_meta_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.catalog_meta
    ADD CONSTRAINT catalog_meta_pkey PRIMARY KEY (key);


--
-- Name: contexts contexts_identity_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.contexts
    ADD CONSTRAINT contexts_identity_key UNIQUE (identity);


--
-- Name: contexts contexts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.contexts
    ADD CONSTRAINT contexts_pkey PRIMARY KEY (id);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_run_pk_jobid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_run_pk_jobid_key UNIQUE (run_pk, jobid);


--
-- Name: placements placements_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.placements
    ADD CONSTRAINT placements_pkey PRIMARY KEY (id);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);


--
-- Name: runs runs_run_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_run_id_key UNIQUE (run_id);


--
-- Name: server_losses server_losses_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.server_losses
    ADD CONSTRAINT server_losses_pkey PRIMARY KEY (id);


--
-- Name: servers servers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.servers
    ADD CONSTRAINT servers_pkey PRIMARY KEY (id);


--
-- Name: ix_attempts_finished; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_attempts_finished ON public.attempts USING btree (finished);


--
-- Name: ix_attempts_job_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_attempts_job_id ON public.attempts USING btree (job_id);


--
-- Name: ix_attempts_key; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_attempts_key ON public.attempts USING btree (key);


--
-- Name: ix_attempts_loss_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_attempts_loss_id ON public.attempts USING btree (loss_id);


--
-- Name: ix_attempts_server_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_attempts_server_id ON public.attempts USING btree (server_id);


--
-- Name: ix_events_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_events_at ON public.events USING btree (at);


--
-- Name: ix_placements_server_context; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_placements_server_context ON public.placements USING btree (server_id, context_id);


--
-- Name: ix_placements_state; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_placements_state ON public.placements USING btree (state);


--
-- Name: ix_runs_started; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_runs_started ON public.runs USING btree (started);


--
-- Name: ix_server_losses_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_server_losses_at ON public.server_losses USING btree (at);


--
-- Name: ix_servers_address; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_servers_address ON public.servers USING btree (address);


--
-- Name: ux_servers_live_address; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX ux_servers_live_address ON public.servers USING btree (address) WHERE ("left" IS NULL);


--
-- Name: attempts attempts_job_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.attempts
    ADD CONSTRAINT attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.jobs(id);


--
-- Name: attempts attempts_loss_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.attempts
    ADD CONSTRAINT attempts_loss_id_fkey FOREIGN KEY (loss_id) REFERENCES public.server_losses(id);


--
-- Name: attempts attempts_server_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.attempts
    ADD CONSTRAINT attempts_server_id_fkey FOREIGN KEY (server_id) REFERENCES public.servers(id);


--
-- Name: events events_run_pk_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_run_pk_fkey FOREIGN KEY (run_pk) REFERENCES public.runs(id);


--
-- Name: events events_server_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_server_id_fkey FOREIGN KEY (server_id) REFERENCES public.servers(id);


--
-- Name: jobs jobs_context_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_context_id_fkey FOREIGN KEY (context_id) REFERENCES public.contexts(id);


--
-- Name: jobs jobs_run_pk_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_run_pk_fkey FOREIGN KEY (run_pk) REFERENCES public.runs(id);


--
-- Name: placements placements_context_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.placements
    ADD CONSTRAINT placements_context_id_fkey FOREIGN KEY (context_id) REFERENCES public.contexts(id);


--
-- Name: placements placements_server_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.placements
    ADD CONSTRAINT placements_server_id_fkey FOREIGN KEY (server_id) REFERENCES public.servers(id);


--
-- Name: server_losses server_losses_server_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.server_losses
    ADD CONSTRAINT server_losses_server_id_fkey FOREIGN KEY (server_id) REFERENCES public.servers(id);


--
-- PostgreSQL database dump complete
--


