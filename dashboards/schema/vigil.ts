/**
 * The type vigil's dashboard JSON is checked against (`dashboards.typecheck`).
 *
 * Every dashboard must be a `Dashboard` of `@grafana/schema` (Grafana 11.6's own
 * dashboard type) and, more strictly, a `VigilDashboard`: the same type with each
 * panel's `options` and `fieldConfig.defaults.custom` narrowed to its plugin's
 * generated types (`TimeSeriesPanelCfg`, `StatPanelCfg`, ... in `@grafana/schema`), and
 * each target a Prometheus query.
 *
 * `Json<T>` is the JSON form of `T`: a string enum (`ThresholdsMode`, `LegendDisplayMode`,
 * ...) is written as its string value in JSON, which TypeScript's nominal enums would
 * otherwise refuse. Nothing else is loosened.
 */
import type {
  Dashboard,
  DataQuery,
  DataSourceRef,
  FieldConfig,
  FieldConfigSource,
  Panel,
  RowPanel,
} from "@grafana/schema";
import type * as bargauge from "@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen.js";
import type * as stat from "@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen.js";
import type * as table from "@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen.js";
import type * as timeseries from "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen.js";

/** `T` as JSON spells it: string enums become the union of their values. */
export type Json<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

/**
 * A Prometheus panel query: Grafana's `DataQuery` plus the Prometheus query fields vigil
 * writes. `@grafana/schema` 11.6 ships no Prometheus query type; these fields are those of
 * the Prometheus data source's query model (`PromQuery` in Grafana's prometheus package).
 */
export interface PrometheusQuery extends DataQuery {
  datasource: DataSourceRef & { type: "prometheus"; uid: string };
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  format?: "time_series" | "table" | "heatmap";
  editorMode?: "code" | "builder";
  exemplar?: boolean;
  interval?: string;
  intervalFactor?: number;
}

/** `FieldConfigSource` whose `defaults.custom` is exactly the plugin's field config. */
type TypedFieldConfigSource<TCustom> = Omit<FieldConfigSource, "defaults"> & {
  defaults: Omit<FieldConfig, "custom"> & { custom?: TCustom };
};

/** A panel of plugin `TType` with that plugin's options and custom field config. */
type TypedPanel<TType extends string, TOptions, TCustom> = Omit<
  Panel,
  "type" | "options" | "fieldConfig" | "targets"
> & {
  type: TType;
  options: TOptions;
  fieldConfig: TypedFieldConfigSource<TCustom>;
  targets: PrometheusQuery[];
};

export type VigilPanel =
  | TypedPanel<"timeseries", timeseries.Options, timeseries.FieldConfig>
  | TypedPanel<"stat", stat.Options, Record<string, never>>
  | TypedPanel<"bargauge", bargauge.Options, Record<string, never>>
  | TypedPanel<"table", table.Options, table.FieldConfig>;

export type VigilRow = Omit<RowPanel, "panels"> & { panels: VigilPanel[] };

export type VigilDashboard = Omit<Dashboard, "panels"> & {
  panels: Array<VigilPanel | VigilRow>;
};
